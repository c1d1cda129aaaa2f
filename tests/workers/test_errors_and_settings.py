"""The worker's pure parts: error translation, the budget correction, settings validation."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from fleetgen import errors
from fleetgen.engine import decision
from fleetgen.engine.decision import RetryPolicy
from fleetgen.engine.sglang import RULE, from_response
from fleetgen.errors import ConfigError
from workers.settings import WorkerSettings

REQUESTED = ("Requested token count exceeds the model's maximum context length of 8192 tokens. "
             "You requested a total of 8303 tokens: 111 tokens from the input messages and 8192 "
             "tokens for the completion. Please reduce the number of tokens in the input "
             "messages or the completion to fit within the limit.")


def response(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body)


def test_native_400_context_error_is_parsed_with_the_servers_count() -> None:
    err = from_response(response(400, {"error": {"message": REQUESTED}}))
    assert isinstance(err, errors.ContextLengthError)
    assert (err.server_prompt_tokens, err.context_length) == (111, 8192)
    assert RULE.correction(err, 8192) == 8192 - 111 - 2


def test_input_too_long_errors_cannot_be_corrected() -> None:
    for message in ("The input (9000 tokens) is longer than the model's context length "
                    "(8192 tokens).",
                    "Input length (8190 tokens) exceeds the maximum allowed length (8186 "
                    "tokens). Use a shorter input or enable --allow-auto-truncate."):
        err = from_response(response(400, {"error": {"message": message}}))
        assert isinstance(err, errors.ContextLengthError)
        assert RULE.correction(err, 100) is None


def test_correction_past_the_scheduler_limit_is_refused() -> None:
    msg = REQUESTED.replace("111 tokens from", "8187 tokens from")
    err = from_response(response(400, {"error": {"message": msg}}))
    assert isinstance(err, errors.ContextLengthError)
    assert RULE.correction(err, 50) is None


@pytest.mark.parametrize(("status", "kind"), [
    (503, errors.RetryableError), (502, errors.RetryableError), (504, errors.RetryableError),
    (429, errors.RetryableError), (500, errors.RetryableError), (400, errors.PermanentError),
    (401, errors.PermanentError), (404, errors.PermanentError)])
def test_status_codes_map_to_the_error_classes(status: int, kind: type) -> None:
    body = {"object": "error", "message": "The request queue is full.", "type": str(status),
            "param": None, "code": status}
    err = from_response(response(status, body))
    assert type(err) is kind and err.status == status
    assert err.message == "The request queue is full."


def test_transport_errors() -> None:
    req = httpx.Request("POST", "http://x/generate")
    assert isinstance(decision.from_transport(httpx.ConnectError("refused", request=req)),
                      errors.EngineUnreachable)
    assert isinstance(decision.from_transport(httpx.ReadTimeout("slow", request=req)),
                      errors.RetryableError)
    assert isinstance(decision.from_transport(httpx.RemoteProtocolError("eof", request=req)),
                      errors.RetryableError)


def test_backoff_is_bounded_and_grows() -> None:
    import random

    policy = RetryPolicy(max_attempts=5, base_s=1.0, cap_s=8.0)
    rng = random.Random(1)
    worst = [max(policy.backoff_s(a, rng.random()) for _ in range(200)) for a in range(1, 7)]
    assert worst[0] <= 1.0 and worst[2] <= 4.0 and max(worst) <= 8.0
    assert worst[3] > worst[0]


def test_settings_validation_names_the_variable() -> None:
    base = {"FLEETGEN_REDIS_URL": "redis://127.0.0.1:1/0"}
    with pytest.raises(ConfigError,
                       match=r"FLEETGEN_VISIBILITY_TIMEOUT_S \(9\) must be at least 5 x"):
        WorkerSettings.from_env({**base, "FLEETGEN_VISIBILITY_TIMEOUT_S": "9"})
    # A lease, not a bound on a task: far shorter than the request timeout is fine.
    leased = WorkerSettings.from_env({**base, "FLEETGEN_VISIBILITY_TIMEOUT_S": "40",
                                      "FLEETGEN_REQUEST_TIMEOUT_S": "900"})
    assert leased.visibility_timeout_s == 40
    with pytest.raises(ConfigError, match=r"FLEETGEN_HANDBACK_S \(60\) must be less than"):
        WorkerSettings.from_env({**base, "FLEETGEN_HANDBACK_S": "60"})
    with pytest.raises(ConfigError, match="FLEETGEN_MAX_ATTEMPTS"):
        WorkerSettings.from_env({**base, "FLEETGEN_MAX_ATTEMPTS": "abc"})
    with pytest.raises(ConfigError, match="FLEETGEN_ENGINE_URL"):
        WorkerSettings.from_env({**base, "FLEETGEN_ENGINE_URL": "localhost:30000"})


def test_celerys_per_task_lines_are_off_unless_asked() -> None:
    base = {"FLEETGEN_ENGINE_URL": "http://127.0.0.1:30000"}
    assert WorkerSettings.from_env(base).task_log is False
    assert WorkerSettings.from_env({**base, "FLEETGEN_TASK_LOG": "1"}).task_log is True


def test_a_misconfigured_worker_says_one_line_and_exits_3() -> None:
    done = subprocess.run([sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q",
                           "fleetgen"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "FLEETGEN_ENGINE_URL": "nope"})
    assert done.returncode == 3
    assert done.stderr.strip() == "fleetgen worker: FLEETGEN_ENGINE_URL must be an http(s) " \
                                  "URL, got 'nope'"


def test_the_worker_state_lives_in_one_place_and_resets() -> None:
    """What a worker process keeps (workers/state.py): configured, counted, then reset as a
    new process has it."""
    from workers import runtime
    from workers.state import DEFAULT_CONCURRENCY, reset, state

    runtime.configure("gpu3@h", 9)
    with runtime.in_flight():
        assert (runtime.in_flight_count(), runtime.concurrency()) == (1, 9)
    state.dropped["r"] = 2
    reset()
    assert (state.worker_name.startswith("worker@"), state.concurrency, state.inflight,
            state.dropped, state.runtime) == (True, DEFAULT_CONCURRENCY, 0, {}, None)
