"""produce and drain are never silent while they run: on a terminal a bar with the count, rate
and ETA (drain under a real pseudo-terminal), elsewhere a line a minute; drain ends with a
short table, not the whole summary.json."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import orjson
import pytest
import redis

from fleetgen.cli import progress
from fleetgen.cli.produce import Terminal
from fleetgen.queue.contract import KIND_RESULT
from fleetgen.runstate.keys import RunKeys
from tests.support.waiting import wait_until
from workers.sink import StreamSink

RUN = "shown"


def write_run(client: redis.Redis, rows: int) -> None:
    client.hset(RunKeys(RUN).manifest, mapping={"started_at": time.time() - 5,
                                                "state": "produced", "total": rows,
                                                "read": rows, "expected": rows})
    sink = StreamSink(client, worker="gpu0@h")
    for line in range(1, rows + 1):
        sink.emit(RUN, KIND_RESULT, line, {"id": f"r{line}", "line": line, "completion": "x",
                                           "finish_reason": "stop", "prompt_tokens": 5,
                                           "completion_tokens": 3, "max_tokens": 100},
                  {"done": 1, "prompt_tokens": 5, "completion_tokens": 3})


def drain_argv(redis_url: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "fleetgen", "drain", "--run", RUN, "--out", str(out),
            "--redis", redis_url]


def test_drain_ends_with_a_short_table(rclient: redis.Redis, redis_url: str,
                                       tmp_path: Path) -> None:
    write_run(rclient, 5)
    done = subprocess.run(drain_argv(redis_url, tmp_path / "out"), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "{" not in done.stdout and len(lines) < 20
    table = {line.split("  ")[1].strip(): line.rsplit("  ", 1)[1].strip() for line in lines}
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert table["requests"] == "5" == str(summary["total"]) and table["done"] == "5"
    assert table["complete"] == "yes"


def test_drain_on_a_terminal_shows_a_bar_with_rate(rclient: redis.Redis, redis_url: str,
                                                   tmp_path: Path) -> None:
    write_run(rclient, 5)
    leader, follower = pty.openpty()
    # A terminal 120 columns wide (a new pty has 0, in which tqdm draws nothing).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(drain_argv(redis_url, tmp_path / "out"), stdin=follower,
                            stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    seen = b""

    def ended() -> bool:
        nonlocal seen
        while select.select([leader], [], [], 0.05)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other side closed: the command has exited
                return proc.poll() is not None
            if not chunk:
                break
            seen += chunk
        return proc.poll() is not None

    wait_until(ended, 60, "drain to end")
    os.close(leader)
    text = seen.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "rows written" in text and "5/5" in text and "rows/s" in text


def test_without_a_terminal_a_line_every_ten_seconds(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert progress.LINE_EVERY_S == 10.0
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)  # every figure, instead of 10 s
    terminal = Terminal("r", show_progress=False)
    terminal.read(0, 1000)
    terminal.read(400, 1000)
    terminal.generated(0, 1000)
    terminal.generated(250, 1000)
    terminal.close()
    err = capsys.readouterr().err.splitlines()
    read = [x for x in err if x.startswith("fleetgen produce: run 'r': read 400/1,000 rows, ")]
    generated = [x for x in err if "generated 250/1,000 rows" in x]
    assert read and generated and all(" rows/s, ETA " in x for x in read + generated)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 3600.0)
    quiet = Terminal("r", show_progress=False)
    quiet.read(0, 10)
    quiet.read(5, 10)
    assert capsys.readouterr().err == ""  # not before the minute is up
