"""`fleetgen run` of one file opens it once (issue 49): the command resolves its input once and
hands it down, so only the producer's pass reads it (no check of it before the job, no second
resolution in the resume check). Counted as the kernel sees it: the whole `fleetgen run`
process under strace -f (its threads, and its workers, which never open it), every open of
the input's path, on a fresh run and on the same command resuming it after Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.support.binaries import require_binary
from tests.support.cli import fleetgen_cli
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.simproc import sim_process
from tests.support.sims import engine_flags
from tests.support.strace import opens_of
from tests.support.waiting import wait_until


def traced(strace: str, log: Path, argv: list[str]) -> list[str]:
    return [strace, "-f", "-qq", "-e", "trace=open,openat", "-o", str(log), *argv]


def lines_in(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_fresh_run_and_its_resume_each_open_the_input_once(tmp_path: Path) -> None:
    strace = require_binary("strace", "/usr/bin/strace",
                            "to count the opens of the input by the real CLI")
    prompts = tmp_path / "prompts.jsonl"
    good = set(make_prompts(prompts, 60)["good"])
    # Slow answers (2 s each, 4 at once): the run is still going when it is interrupted.
    with sim_process(tmp_path / "sim.log", "--ttft-ms", "2000", "--max-running-requests",
                     "4") as urls:
        argv = fleetgen_cli("run", "prompts.jsonl", *engine_flags(urls), "--out", "out")
        # A session of its own, as a terminal's foreground job: Ctrl-C reaches its group.
        fresh = subprocess.Popen(traced(strace, tmp_path / "fresh.log", argv), cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        wait_until(lambda: lines_in(tmp_path / "out" / "results.jsonl") >= 4, 120,
                   "a few rows written")
        # Ctrl-C: the group's SIGINT; strace -o FILE blocks it for itself (its -I 3), the
        # traced command stops and strace exits with its code.
        os.killpg(fresh.pid, signal.SIGINT)
        said = fresh.communicate(timeout=60)[0].decode(errors="replace")
        assert fresh.returncode == 130, said[-3000:]
        assert "to resume" in said, said[-3000:]
        written = lines_in(tmp_path / "out" / "results.jsonl")
        assert written < len(good)  # stopped half-way: the resume has rows to send
        resumed = subprocess.run(traced(strace, tmp_path / "resumed.log", argv), cwd=tmp_path,
                                 capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming run" in resumed.stdout
    assert_exactly_once(tmp_path / "out", good)
    for log in ("fresh.log", "resumed.log"):  # opened by its absolute or its relative name
        trace = (tmp_path / log).read_text()
        assert opens_of(trace, prompts.resolve()) + opens_of(trace, Path("prompts.jsonl")) \
            == 1, log
