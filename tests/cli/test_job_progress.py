"""`fleetgen run` and the demo in a log (no terminal): a line every 10 s with the requests
written, the rate, the engines up and an ETA that counts the answers still running
(fleetgen/cli/runview.py LogLine)."""

from __future__ import annotations

import pytest

from fleetgen.cli.runview import LINE_EVERY_S, LogLine, eta_s


def say(text: str) -> None:
    print(f"fleetgen run: {text}")


def test_a_line_every_ten_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    assert LINE_EVERY_S == 10.0
    now = [1000.0]
    line = LogLine(say, show=True, clock=lambda: now[0])
    line.tick(0, 3600, in_flight=0, engines=(3, 3))
    now[0] += 9
    line.tick(90, 3600, in_flight=0, engines=(3, 3))
    assert capsys.readouterr().out == ""  # not 10 s yet
    now[0] += 1
    line.tick(100, 3600, engines=(2, 3))
    assert capsys.readouterr().out == \
        "fleetgen run: 100/3,600 requests written, 10.0/s, engines 2/3, ETA 5m50s\n"
    now[0] += 10
    line.tick(200, None)
    assert capsys.readouterr().out == "fleetgen run: 200/? requests written, 10.0/s, ETA -\n"
    hidden = LogLine(say, show=False, clock=lambda: now[0])
    now[0] += 600
    hidden.tick(5000, 6000)
    assert capsys.readouterr().out == ""  # a terminal has its bar instead


def test_the_eta_counts_the_answers_still_running(capsys: pytest.CaptureFixture[str]) -> None:
    # 24 slots, each answer 24 s: one request a second. At the end the last 5 all run, and
    # they started at most one answer's time ago: not "5 s" (the rate alone), about 24 s.
    now = [0.0]
    line = LogLine(say, show=True, every_s=1e9, clock=lambda: now[0])
    for second in range(0, 120):
        now[0] = float(second)
        line.tick(second, 125, in_flight=24)
    text = line.line(120.0, 120, 125, 5, None)
    assert text.endswith(("ETA 0m23s", "ETA 0m24s")), text  # 24 x 119 s of 120 in flight
    assert eta_s(5, 5, 1.0, 24.0) == 24.0  # all running: one answer's time
    assert eta_s(100, 24, 1.0, 24.0) == 100.0  # steady: the same as the rate says
    assert eta_s(0, 0, 1.0, 24.0) == 0.0 and eta_s(5, 5, 0.0, None) is None
