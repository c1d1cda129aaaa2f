"""What can go wrong when asking an engine for a completion, split by what to do about it."""

from __future__ import annotations

import re

import httpx


class EngineError(Exception):
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
    """No connection at all: the server is gone, so stop consuming rather than burn retries."""

    kind = "unreachable"


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


RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

_REQUESTED = re.compile(
    r"maximum context length of (\d+) tokens.*?(\d+) tokens from the input", re.S)
_INPUT_LONGER = re.compile(r"input \((\d+) tokens\) is longer than the model's context length "
                           r"\((\d+) tokens\)")
_INPUT_ALLOWED = re.compile(r"Input length \((\d+) tokens\) exceeds the maximum allowed "
                            r"length \((\d+) tokens\)")


def from_response(response: httpx.Response) -> EngineError:
    """Translate an error response; the only place that reads SGLang's error bodies."""
    status = response.status_code
    message = error_message(response)
    if status in RETRYABLE_STATUSES:
        return RetryableError(message, status)
    if status == 400:
        parsed = parse_context_error(message)
        if parsed is not None:
            prompt_tokens, context = parsed
            return ContextLengthError(message, status, prompt_tokens, context)
    return PermanentError(message, status)


def from_transport(exc: httpx.HTTPError) -> EngineError:
    """Translate an httpx exception raised before any response arrived."""
    if isinstance(exc, httpx.ConnectError):
        return EngineUnreachable(f"cannot connect to engine: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return RetryableError(f"engine timed out: {type(exc).__name__}")
    return RetryableError(f"engine connection failed: {type(exc).__name__}: {exc}")


def parse_context_error(message: str) -> tuple[int, int | None] | None:
    """(server prompt tokens, context length) from SGLang's three length errors. The context
    is None when the input alone is too long: then no smaller budget can help."""
    m = _REQUESTED.search(message)
    if m:
        return int(m.group(2)), int(m.group(1))
    m = _INPUT_LONGER.search(message) or _INPUT_ALLOWED.search(message)
    if m:
        return int(m.group(1)), None
    return None


def error_message(response: httpx.Response) -> str:
    """The message of SGLang's native, HTTPException or OpenAI error bodies, else the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in body:
            return str(body["message"])
    return str(body)[:500]
