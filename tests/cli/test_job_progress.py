"""`fleetgen run` and the demo in a log (no terminal): a line a minute with rows, rate and
ETA, nothing in between (fleetgen/cli/job.py MinuteLine)."""

from __future__ import annotations

import pytest

from fleetgen.cli.job import MinuteLine


def say(text: str) -> None:
    print(f"fleetgen run: {text}")


def test_a_line_a_minute_with_rate_and_eta(capsys: pytest.CaptureFixture[str]) -> None:
    now = [1000.0]
    line = MinuteLine(say, show=True, clock=lambda: now[0])
    now[0] += 30
    line.tick(300, 3600)
    assert capsys.readouterr().out == ""  # not a minute yet
    now[0] += 30
    line.tick(600, 3600)
    assert capsys.readouterr().out == "fleetgen run: 600/3600 rows written, 10.0 rows/s, " \
                                      "ETA 5 min\n"
    now[0] += 59
    line.tick(1190, None)
    assert capsys.readouterr().out == ""
    now[0] += 1
    line.tick(1200, None)
    assert capsys.readouterr().out == "fleetgen run: 1200/? rows written, 10.0 rows/s, ETA -\n"
    hidden = MinuteLine(say, show=False, clock=lambda: now[0])
    now[0] += 600
    hidden.tick(5000, 6000)
    assert capsys.readouterr().out == ""  # a terminal has its bar instead
