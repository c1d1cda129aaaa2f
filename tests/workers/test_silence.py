"""A worker's reading of its engine's silence (workers/silence.py): only a timeout starts one,
and any HTTP answer ends it, so a busy engine that answers late is never silent for long."""

from __future__ import annotations

from fleetgen import errors
from workers.silence import Silence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_timeout_starts_a_silence_that_grows_until_an_answer() -> None:
    clock = Clock()
    silence = Silence(clock)
    assert silence.silent_s() == 0.0
    silence.heard(errors.EngineTimeout("engine timed out: ReadTimeout"))
    clock.now += 4
    silence.heard(errors.EngineTimeout("engine timed out: ReadTimeout"))  # not a new start
    clock.now += 3
    assert silence.silent_s() == 7.0
    silence.heard(None)
    assert silence.silent_s() == 0.0


def test_any_http_answer_ends_it_and_a_refused_connection_is_neither() -> None:
    clock = Clock()
    silence = Silence(clock)
    for answer in (errors.RetryableError("queue full", 503), errors.PermanentError("no", 400),
                   errors.AbortedError("aborted", 200)):
        silence.heard(errors.EngineTimeout("engine timed out: ReadTimeout"))
        clock.now += 5
        silence.heard(answer)
        assert silence.silent_s() == 0.0, answer
    silence.heard(errors.EngineUnreachable("cannot connect to engine: refused"))
    clock.now += 5
    assert silence.silent_s() == 0.0  # the health check's business, not a silence
    silence.heard(errors.EngineTimeout("engine timed out: ReadTimeout"))
    silence.heard(errors.EngineUnreachable("cannot connect to engine: refused"))
    clock.now += 5
    assert silence.silent_s() == 5.0  # nor does it end one


def test_a_busy_engine_whose_answers_come_between_timeouts_stays_quiet() -> None:
    # Saturated: every other request outlasts the timeout, the rest are answered late.
    clock = Clock()
    silence = Silence(clock)
    longest = 0.0
    for i in range(200):
        clock.now += 1.5
        silence.heard(errors.EngineTimeout("engine timed out") if i % 2 else None)
        longest = max(longest, silence.silent_s())
    assert longest == 0.0
