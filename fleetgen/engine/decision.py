"""What an engine's answer means and what a worker does about it, decided once: one table from
HTTP status and error class to kind, and one pure function from an error and an attempt to a
decision (retry, correct, fail or hand back); the waiting is the task's.

It sits at the engine boundary, beside the clients that raise these errors, because the clients
translate every status and transport error through the same table (as httpx's `_exceptions.py`
maps httpcore's once); the worker's task (workers/generate.py) acts on the decision. It imports
only the floors below it and httpx, so both the engine floor and the worker use it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import httpx

from fleetgen import errors
from fleetgen.settings.envvars import BACKOFF_BASE_S, BACKOFF_CAP_S, ENGINE_GONE_S, MAX_ATTEMPTS

if TYPE_CHECKING:
    from fleetgen.engine.api import LengthRule


class Kind(enum.Enum):
    """What an engine error is about, whatever the engine."""

    TRANSIENT = "transient"  # the same request may work: a later attempt
    BUDGET = "budget"  # prompt + max_tokens past the server's context: a smaller max_tokens
    REFUSED = "refused"  # the request itself: nothing this worker sends again can help


# -- the table --------------------------------------------------------------------------------
# Every status other than 200 that is not listed is a refusal of the request (400, 401, 404,
# 422, 501, ...). 408/429 and these 5xx say "not now": a server busy, restarting or behind a
# proxy that lost it. Engines refine a 400 only (a context-length or duplicate-rid message).
STATUS_ERRORS: dict[int, type[errors.EngineError]] = {
    408: errors.RetryableError, 429: errors.RetryableError, 500: errors.RetryableError,
    502: errors.RetryableError, 503: errors.RetryableError, 504: errors.RetryableError,
}
# httpx's exceptions before any answer, most specific first. A refused connection is told
# apart (EngineUnreachable) for the CLI's exit code; to a worker it is transient like the rest,
# since only the health probe can tell a restart from a server gone for good.
TRANSPORT_ERRORS: tuple[tuple[type[httpx.HTTPError], type[errors.EngineError], str], ...] = (
    (httpx.ConnectError, errors.EngineUnreachable, "cannot connect to engine: {exc}"),
    # The worker's own pool full is a timeout of this process, not a silence of the engine.
    (httpx.PoolTimeout, errors.RetryableError, "engine timed out: {name}"),
    (httpx.TimeoutException, errors.EngineTimeout, "engine timed out: {name}"),
    (httpx.HTTPError, errors.RetryableError, "engine connection failed: {name}: {exc}"),
)
# Error class -> kind, looked up along the class's ancestry (the most specific row wins).
KINDS: dict[type, Kind] = {
    errors.RetryableError: Kind.TRANSIENT,  # timeouts, 5xx, 429, a 200 that is not an answer
    errors.EngineUnreachable: Kind.TRANSIENT,
    errors.AbortedError: Kind.TRANSIENT,  # the server ended the request; a new one may finish
    errors.DuplicateRidError: Kind.TRANSIENT,  # the next attempt's rid is new
    errors.ContextLengthError: Kind.BUDGET,
    errors.PermanentError: Kind.REFUSED,
}


def kind_of(error: errors.EngineError) -> Kind:
    for cls in type(error).__mro__:
        if cls in KINDS:
            return KINDS[cls]
    return Kind.REFUSED  # a bare EngineError: nothing says another attempt could help


def from_status(status: int, message: str) -> errors.EngineError:
    """The error of a non-200 answer whose body the engine gave no meaning of its own."""
    return STATUS_ERRORS.get(status, errors.PermanentError)(message, status)


def from_transport(exc: httpx.HTTPError) -> errors.EngineError:
    """The error of an httpx exception raised before any answer arrived."""
    error, message = next((error, message) for seen, error, message in TRANSPORT_ERRORS
                          if isinstance(exc, seen))
    return error(message.format(exc=exc, name=type(exc).__name__))


def not_json(what: str, exc: ValueError) -> errors.EngineError:
    """A 200 whose body is not JSON: cut short or garbled on the way, so transient."""
    return errors.RetryableError(f"{what} sent invalid JSON: {exc}", 200)


# -- the policy and the decision ---------------------------------------------------------------
class _PolicySettings(Protocol):
    """The worker's settings the policy reads (workers/settings.py), without importing them:
    the engine floor imports only the floors below it."""

    @property
    def max_attempts(self) -> int: ...
    @property
    def backoff_base_s(self) -> float: ...
    @property
    def backoff_cap_s(self) -> float: ...
    @property
    def engine_gone_s(self) -> float: ...


@dataclass(frozen=True)
class RetryPolicy:
    """How many engine calls a prompt gets and how long a retry waits (FLEETGEN_MAX_ATTEMPTS,
    FLEETGEN_BACKOFF_*), and how long a server may be down before it counts as gone."""

    max_attempts: int = MAX_ATTEMPTS.default
    base_s: float = BACKOFF_BASE_S.default
    cap_s: float = BACKOFF_CAP_S.default
    gone_s: float = ENGINE_GONE_S.default  # an engine down this long is gone: hand it back

    @classmethod
    def of(cls, s: _PolicySettings) -> RetryPolicy:
        return cls(s.max_attempts, s.backoff_base_s, s.backoff_cap_s, s.engine_gone_s)

    def backoff_s(self, retries: int, jitter: float) -> float:
        """Exponential backoff with full jitter (`jitter` drawn uniformly from [0, 1)), so
        retries from 128 threads don't align."""
        return jitter * min(self.cap_s, self.base_s * 2 ** (retries - 1))


@dataclass(frozen=True)
class Attempt:
    """One prompt's engine calls so far, as the task carries them from one call to the next."""

    max_tokens: int  # the budget the last call was sent with, and the next one is
    attempts: int = 0  # engine calls made, corrected ones included
    corrected: bool = False  # the budget was corrected once: a second would loop
    retries: int = 0  # transient errors met with the server up (the run's `retries` stat)

    def called(self) -> Attempt:
        return replace(self, attempts=self.attempts + 1)


class Action(enum.Enum):
    RETRY = "retry"  # the same request again, after `delay_s`
    CORRECT = "correct"  # again at once, with the corrected `attempt.max_tokens`
    FAIL = "fail"  # write a failure record: no attempt can help, or none is left
    HAND_BACK = "hand_back"  # requeue for another worker: this one's server is gone


@dataclass(frozen=True)
class Decision:
    action: Action
    attempt: Attempt  # the prompt's attempts with this error counted
    reason: str  # for the task's log line
    delay_s: float = 0.0


def asks_server(error: errors.EngineError) -> bool:
    """Whether the decision on `error` depends on the server being up: only a transient error
    may come from a server that is gone, and only then is a health probe worth its wait."""
    return kind_of(error) is Kind.TRANSIENT


def decide(error: errors.EngineError, attempt: Attempt, policy: RetryPolicy,
           rule: LengthRule, *, server_up: bool = True, jitter: float = 1.0) -> Decision:
    """What to do after `attempt.attempts` calls, the last of which raised `error`.

    `server_up`: whether the server answered its health probe within `policy.gone_s` (the
    task looks only when `asks_server(error)`); `jitter`: a uniform draw from [0, 1) that
    spreads the retry's delay."""
    kind = kind_of(error)
    if kind is Kind.BUDGET and isinstance(error, errors.ContextLengthError):
        return _correct(error, attempt, rule)
    if kind is not Kind.TRANSIENT:
        return Decision(Action.FAIL, attempt, error.message)
    # A transient error from a server that stays refused or not ready past gone_s is a server
    # that is gone (down, dead): another GPU gets the prompt instead of its retries burning
    # here, even on the last attempt. An abort or a 503 from a server that is up is retried.
    if not server_up:
        return Decision(Action.HAND_BACK, attempt, error.message)
    attempt = replace(attempt, retries=attempt.retries + 1)
    if attempt.attempts >= policy.max_attempts:
        return Decision(Action.FAIL, attempt, error.message)
    return Decision(Action.RETRY, attempt, error.message,
                    policy.backoff_s(attempt.retries, jitter))


def _correct(error: errors.ContextLengthError, attempt: Attempt, rule: LengthRule) -> Decision:
    """A context-length 400 is possible only when the server's tokenizer counts differently
    from ours: resend once with the budget the server's own counts allow, if any does."""
    fixed = None if attempt.corrected else rule.correction(error, attempt.max_tokens)
    if fixed is None:
        return Decision(Action.FAIL, attempt, error.message)
    return Decision(Action.CORRECT, replace(attempt, max_tokens=fixed, corrected=True),
                   f"context-length 400, max_tokens {attempt.max_tokens} -> {fixed}")
