"""bench/gap.py: a fleet run's excess over the ideal split into start-up, steady idle, tail and
end, on made-up answers whose idle time is known."""

from __future__ import annotations

import pytest

from bench.gap import Answer, answers_of, decompose


def answer(line: int, server: int, start: float, end: float, speed: float = 1.0) -> Answer:
    return Answer(line=line, server=server, sent_s=start, start_s=start, end_s=end,
                  service_s=(end - start) * speed)


def test_the_phases_add_up_to_the_idle_capacity() -> None:
    # Two servers of one slot; server 1 at half speed. Both start at 1 s (start-up: 1 s of
    # the whole fleet idle); server 0 idles 0.5 s in the middle while the queue holds work;
    # server 1's last answer runs 1 s after server 0 is done (the tail).
    answers = [answer(1, 0, 1.0, 3.0), answer(2, 1, 1.0, 5.0, 0.5),
               answer(3, 0, 3.5, 5.0), answer(4, 1, 5.0, 6.0, 0.5)]
    gap = decompose(answers, [1.0, 0.5], 1, (6.2, 4.0, 5.5), [3.5, 5.0])
    phases = gap["phases"]
    rate = 1.5  # full-speed slot-seconds a second
    assert phases["startup"]["idle_s"] == pytest.approx(1.0)
    assert phases["steady"]["idle_s"] == pytest.approx(0.5 / rate)
    assert phases["tail"]["idle_s"] == pytest.approx(1.0 / rate)  # server 0 idle 5-6 s
    assert phases["end"]["idle_s"] == pytest.approx(0.2)
    assert (gap["last_server"], gap["fast_servers_done_s"]) == (1, 5.0)
    assert [a["line"] for a in gap["after_fast_done"]] == [4]
    assert gap["simulator_beyond_model_s"] == pytest.approx(0.0)
    assert gap["over_replay_s"] == pytest.approx(0.7)


def test_answers_come_from_result_lines_on_the_run_clock() -> None:
    records = [{"worker": "gpu1@host", "line": 7, "finished_at": 1003.0, "latency_s": 1.5,
                "completion_tokens": 100}]
    [a] = answers_of(records, 1000.0, [1.0, 0.5], lambda tokens: tokens / 100)
    assert (a.server, a.sent_s, a.end_s, a.start_s, a.service_s) == (1, 1.5, 3.0, 1.0, 1.0)
