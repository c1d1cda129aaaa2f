"""The one retry decision (fleetgen/engine/decision.py), as plain functions: every row of its
table, and every decision `decide` can give, with the attempt it hands back."""

from __future__ import annotations

import httpx
import pytest

from fleetgen import errors
from fleetgen.engine import decision
from fleetgen.engine.decision import Action, Attempt, Kind, RetryPolicy, decide
from fleetgen.engine.openai import ContextRule

POLICY = RetryPolicy(max_attempts=3, base_s=1.0, cap_s=8.0, gone_s=60.0)
RULE = ContextRule("vllm")  # room = context - prompt, corrected only below the sent budget
REQUEST = httpx.Request("POST", "http://engine/generate")


@pytest.mark.parametrize(("status", "error"), [
    (408, errors.RetryableError), (429, errors.RetryableError), (500, errors.RetryableError),
    (502, errors.RetryableError), (503, errors.RetryableError), (504, errors.RetryableError),
    # Not listed: a refusal of the request itself, 5xx included.
    (400, errors.PermanentError), (401, errors.PermanentError), (404, errors.PermanentError),
    (422, errors.PermanentError), (501, errors.PermanentError), (505, errors.PermanentError),
])
def test_each_status_is_one_error_class(status: int, error: type) -> None:
    err = decision.from_status(status, "why")
    assert type(err) is error
    assert (err.status, err.message) == (status, "why")


@pytest.mark.parametrize(("exc", "error", "message"), [
    (httpx.ConnectError("refused", request=REQUEST), errors.EngineUnreachable,
     "cannot connect to engine: refused"),
    # A connect that times out is a timeout, not a refusal: the server may be busy.
    (httpx.ConnectTimeout("slow", request=REQUEST), errors.EngineTimeout,
     "engine timed out: ConnectTimeout"),
    (httpx.ReadTimeout("slow", request=REQUEST), errors.EngineTimeout,
     "engine timed out: ReadTimeout"),
    (httpx.PoolTimeout("full", request=REQUEST), errors.RetryableError,
     "engine timed out: PoolTimeout"),
    (httpx.RemoteProtocolError("eof", request=REQUEST), errors.RetryableError,
     "engine connection failed: RemoteProtocolError: eof"),
    (httpx.ReadError("reset", request=REQUEST), errors.RetryableError,
     "engine connection failed: ReadError: reset"),
])
def test_each_transport_error_is_one_error_class(exc: httpx.HTTPError, error: type,
                                                 message: str) -> None:
    err = decision.from_transport(exc)
    assert type(err) is error
    assert (err.message, err.status) == (message, None)


def test_a_200_that_is_not_json_is_transient() -> None:
    err = decision.not_json("/generate", ValueError("Expecting value"))
    assert type(err) is errors.RetryableError and err.status == 200
    assert err.message == "/generate sent invalid JSON: Expecting value"
    assert decision.kind_of(err) is Kind.TRANSIENT


@pytest.mark.parametrize(("error", "kind"), [
    (errors.RetryableError("503", 503), Kind.TRANSIENT),
    (errors.EngineUnreachable("refused"), Kind.TRANSIENT),
    (errors.AbortedError("Aborted", 200), Kind.TRANSIENT),
    (errors.DuplicateRidError("Duplicate request ID detected: r", 400), Kind.TRANSIENT),
    (errors.ContextLengthError("too long", 400, 100, 4096), Kind.BUDGET),
    (errors.PermanentError("bad temperature", 400), Kind.REFUSED),
    # No row of its own: nothing says another attempt could help.
    (errors.EngineError("?"), Kind.REFUSED),
])
def test_each_error_class_is_one_kind(error: errors.EngineError, kind: Kind) -> None:
    assert decision.kind_of(error) is kind
    assert decision.asks_server(error) is (kind is Kind.TRANSIENT)


def test_a_subclass_without_a_row_takes_its_nearest_ancestors_kind() -> None:
    class Busy(errors.AbortedError):
        pass

    class Tight(errors.ContextLengthError):
        pass

    assert decision.kind_of(Busy("b")) is Kind.TRANSIENT
    assert decision.kind_of(Tight("t", 400, 1, 2)) is Kind.BUDGET


# -- decide ---------------------------------------------------------------------------------
def test_a_refusal_fails_at_once_and_counts_no_retry() -> None:
    attempt = Attempt(max_tokens=100, attempts=1)
    v = decide(errors.PermanentError("bad temperature", 400), attempt, POLICY, RULE)
    assert (v.action, v.attempt, v.reason, v.delay_s) == (Action.FAIL, attempt,
                                                          "bad temperature", 0.0)


def test_a_refusal_fails_even_with_the_server_down() -> None:
    v = decide(errors.PermanentError("no", 404), Attempt(100, 1), POLICY, RULE, server_up=False)
    assert v.action is Action.FAIL


def test_a_context_length_400_is_corrected_once_from_the_servers_count() -> None:
    err = errors.ContextLengthError("too long", 400, server_prompt_tokens=4000,
                                    context_length=4096)
    v = decide(err, Attempt(max_tokens=200, attempts=1), POLICY, RULE)
    assert v.action is Action.CORRECT and v.delay_s == 0.0
    assert v.attempt == Attempt(max_tokens=96, attempts=1, corrected=True, retries=0)
    assert "200 -> 96" in v.reason
    # The corrected call refused again: a second correction would loop.
    again = decide(err, v.attempt.called(), POLICY, RULE)
    assert (again.action, again.attempt.max_tokens) == (Action.FAIL, 96)


@pytest.mark.parametrize(("prompt", "context", "sent"), [
    (5000, None, 200),  # the input alone is too long: no budget helps
    (4000, 4096, 96),  # the room is what was sent: a smaller budget is not the fix
])
def test_a_context_length_400_no_budget_can_fix_fails(prompt: int, context: int | None,
                                                      sent: int) -> None:
    err = errors.ContextLengthError("too long", 400, prompt, context)
    v = decide(err, Attempt(max_tokens=sent, attempts=1), POLICY, RULE)
    assert v.action is Action.FAIL and v.attempt == Attempt(sent, attempts=1)


def test_a_context_length_400_never_asks_about_the_server() -> None:
    err = errors.ContextLengthError("too long", 400, 4000, 4096)
    assert not decision.asks_server(err)
    assert decide(err, Attempt(200, 1), POLICY, RULE, server_up=False).action is Action.CORRECT


@pytest.mark.parametrize("error", [
    errors.RetryableError("The request queue is full.", 503),
    errors.EngineUnreachable("cannot connect"),
    errors.AbortedError("Aborted", 200),
    errors.DuplicateRidError("Duplicate request ID detected", 400),
])
def test_a_transient_error_is_retried_after_a_growing_backoff(error: errors.EngineError) -> None:
    first = decide(error, Attempt(100, attempts=1), POLICY, RULE, jitter=0.5)
    assert first.action is Action.RETRY
    assert first.attempt == Attempt(100, attempts=1, retries=1)
    assert first.delay_s == 0.5 * 1.0  # jitter x base
    second = decide(error, replace_attempts(first.attempt, 2), POLICY, RULE, jitter=0.5)
    assert (second.action, second.attempt.retries, second.delay_s) == (Action.RETRY, 2, 1.0)


def test_the_backoff_stops_growing_at_its_cap() -> None:
    policy = RetryPolicy(max_attempts=10, base_s=1.0, cap_s=8.0)
    v = decide(errors.RetryableError("503", 503), Attempt(100, attempts=7, retries=6), policy,
               RULE, jitter=0.999)
    assert v.action is Action.RETRY and v.delay_s == pytest.approx(0.999 * 8.0)
    assert decide(errors.RetryableError("503", 503), Attempt(100, 7, retries=6), policy, RULE,
                  jitter=0.0).delay_s == 0.0


def test_the_last_attempt_fails_and_its_retry_is_counted() -> None:
    v = decide(errors.AbortedError("Aborted", 200), Attempt(100, attempts=3, retries=2), POLICY,
               RULE)
    assert (v.action, v.attempt.retries, v.reason) == (Action.FAIL, 3, "Aborted")


def test_a_transient_error_from_a_server_gone_is_handed_back_even_on_the_last_attempt() -> None:
    for attempts in (1, POLICY.max_attempts):
        attempt = Attempt(100, attempts=attempts, retries=attempts - 1)
        v = decide(errors.EngineUnreachable("cannot connect"), attempt, POLICY, RULE,
                   server_up=False)
        # Handed back, not an attempt spent: the next worker starts the count afresh.
        assert (v.action, v.attempt) == (Action.HAND_BACK, attempt)


def test_the_policy_reads_the_workers_settings() -> None:
    class Settings:
        max_attempts, backoff_base_s, backoff_cap_s, engine_gone_s = 7, 0.5, 4.0, 30.0

    assert RetryPolicy.of(Settings()) == RetryPolicy(7, 0.5, 4.0, 30.0)


def replace_attempts(attempt: Attempt, attempts: int) -> Attempt:
    while attempt.attempts < attempts:
        attempt = attempt.called()
    return attempt
