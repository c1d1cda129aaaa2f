"""Every error fleetgen raises on purpose, in one hierarchy, split by what to do about it.

A user mistake (ConfigError, InputError, TokenizerError) is one line and exit code 3; a bad row
(ContentError) is a rejection and the run goes on; an engine error is retried, corrected,
recorded as a failure, or (EngineGone) hands the prompt back to the queue. Which class an HTTP
status or httpx exception is, and what a worker does about each class, is one table
(`fleetgen/engine/decision.py`); engines refine only what their own 400s mean.
"""

from __future__ import annotations


class FleetgenError(Exception):
    """Base of every error fleetgen raises deliberately."""


# -- user mistakes: the CLI prints them as one line -------------------------------------------
class ConfigError(FleetgenError, ValueError):
    """A user-facing configuration mistake; the CLI prints it as one line."""


class InputError(FleetgenError):
    """The input as a whole cannot be read (missing file, unknown format, wrong columns)."""


class TokenizerError(FleetgenError, ValueError):
    """The tokenizer cannot be loaded or built; no prompt can be tokenized (a setup problem)."""


# What the CLI reports as one line with exit code 3.
USER_MISTAKES = (ConfigError, InputError, TokenizerError)


# -- the machine ------------------------------------------------------------------------------
class DiskFull(FleetgenError):
    """A disk the run writes to is full, or a file reached the size limit (the output files,
    or Redis's own): nothing unwritten was acknowledged, and the same command resumes once
    there is room. One line naming the path (fleetgen/records/diskfull.py), exit code 5."""


# -- one row ----------------------------------------------------------------------------------
class ContentError(FleetgenError, ValueError):
    """One row's messages cannot be rendered; the producer rejects that row and goes on."""


# -- engines ----------------------------------------------------------------------------------
class EngineError(FleetgenError):
    """Base: `kind` names the class in failure records; `status` is the HTTP status or None."""

    kind = "engine_error"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class RetryableError(EngineError):
    """Timeouts, dropped connections, 5xx, 429, 503 queue full: the same request may work."""

    kind = "retryable"


class EngineUnreachable(RetryableError):
    """No connection at all: to the CLI, a server not there (exit code 4); to a worker, a
    transient error until the server stays refused past FLEETGEN_ENGINE_GONE_S (then the
    prompt is handed back)."""

    kind = "unreachable"


class EngineTimeout(RetryableError):
    """No answer within the client's timeout (connecting, sending or reading): transient to
    the prompt, and to the engine's supervisor a sign that the engine may have stopped
    answering while its health check passes (fleetgen/local/silence.py). Same record kind as
    any retryable error: a failure record does not change."""


class AbortedError(RetryableError):
    """The server ended the request itself (SGLang answers an abort with HTTP 200 and
    `finish_reason.type == "abort"`): whatever text came back is partial, never a result.
    A new attempt may finish; the message is the server's."""

    kind = "aborted"


class DuplicateRidError(RetryableError):
    """The server still holds a request with this rid (an earlier delivery of the same
    prompt): a new attempt under a new rid can go through."""

    kind = "duplicate_rid"


class PermanentError(EngineError):
    """The server refused the request itself (400, 401, 404, 422): retrying cannot help."""

    kind = "permanent"


class ContextLengthError(PermanentError):
    """A context-length 400. Possible only when the server's tokenizer counts differently
    from ours; carries the server's own counts so the budget can be corrected once."""

    kind = "context_length"

    def __init__(self, message: str, status: int, server_prompt_tokens: int | None,
                 context_length: int | None) -> None:
        super().__init__(message, status)
        self.server_prompt_tokens = server_prompt_tokens
        self.context_length = context_length


class EngineGone(FleetgenError):
    """The local engine is down: hand the prompt back to the queue for another GPU."""
