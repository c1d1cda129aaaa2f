"""How a command ends when its user ends it: a reader that goes away (`| head`) stops it
quietly, as a Unix tool (no traceback, exit 141 = 128 + SIGPIPE; a real `head` on a real
pipe); an interrupt is one line, naming a resume only where there is one."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys

import pytest
import redis

from fleetgen import exitcodes
from fleetgen.runstate.keys import RunKeys, runs_index_key


def piped(args: str, reader: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """`fleetgen ARGS | READER` in bash, with the exit codes of both sides (PIPESTATUS)."""
    fleetgen = f"{shlex.quote(sys.executable)} -m fleetgen {args}"
    script = f"{fleetgen} | {reader}; echo \"codes ${{PIPESTATUS[*]}}\""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          timeout=timeout_s)


def write_run(client: redis.Redis, run: str) -> None:
    keys = RunKeys(run)
    client.hset(keys.manifest, mapping={"started_at": "1000", "state": "producing",
                                        "read": "20", "expected": "50"})
    client.hset(keys.stats, mapping={"done": "20", "completion_tokens": "2000",
                                     **{f"gpu{i}@h|done": "2" for i in range(10)}})


def test_status_watch_into_head_stops_quietly(rclient: redis.Redis, redis_url: str) -> None:
    # --watch writes again after head has gone: the write that meets the closed pipe.
    write_run(rclient, "r2")
    done = piped(f"status --run r2 --watch --interval 0.05 --redis {redis_url}", "head -3")
    assert done.stdout.splitlines()[0].startswith("run r2")
    assert len(done.stdout.splitlines()) == 4  # head's three lines and the exit codes
    assert done.stdout.splitlines()[-1] == f"codes {exitcodes.CLOSED_PIPE} 0"
    assert done.stderr == ""


def test_a_long_listing_into_head_stops_quietly(rclient: redis.Redis, redis_url: str) -> None:
    # More than a pipe holds (64 KiB), so the writer meets the closed pipe mid-output.
    for n in range(6000):
        rclient.sadd(runs_index_key(), f"run-{n:05d}-with-a-long-enough-name")
    done = piped(f"status --redis {redis_url}", "head -1")
    assert done.stdout.splitlines() == ["run-00000-with-a-long-enough-name",
                                        f"codes {exitcodes.CLOSED_PIPE} 0"]
    assert done.stderr == ""


def test_an_interrupt_says_resume_only_where_there_is_something_to_resume(
        rclient: redis.Redis, redis_url: str) -> None:
    # `status --watch` has nothing to resume: one line, "interrupted", exit 130.
    write_run(rclient, "r3")
    proc = subprocess.Popen([sys.executable, "-m", "fleetgen", "status", "--run", "r3",
                             "--watch", "--redis", redis_url], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("run r3")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (exitcodes.INTERRUPTED, "fleetgen status: interrupted\n")


def test_a_command_that_told_how_it_stopped_gets_no_second_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fleetgen.cli import main, signals

    def stopped(args: object) -> int:
        print("fleetgen produce: interrupted; what is written is kept", file=sys.stderr)
        raise signals.Stopped

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr("fleetgen.cli.produce.run", stopped)
    argv = ["produce", "x.jsonl", "--run", "r"]
    assert main.main(argv) == exitcodes.INTERRUPTED
    assert capsys.readouterr().err == "fleetgen produce: interrupted; what is written is kept\n"
    monkeypatch.setattr("fleetgen.cli.produce.run", interrupted)
    assert main.main(argv) == exitcodes.INTERRUPTED
    assert capsys.readouterr().err == \
        "fleetgen produce: interrupted; run the same command again to resume\n"
