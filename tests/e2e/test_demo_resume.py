"""An interrupted `fleetgen demo` resumes (issue 22, point 3): Ctrl-C and SIGTERM alike write the
summary and exit 130 within 2 s, and the same command with the same --out carries the run
recorded there on, keeping what was written, until every row is written exactly once. A
finished demo's --out is a new run's next time, without the old exports (point 5)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.support.pipeline import assert_exactly_once
from tests.support.waiting import wait_until

ROWS = 300


def demo(prompts: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    # 10 ms a token, 200 tokens an answer: 2 s each, 64 at a time: about 10 s for the set.
    return subprocess.Popen([sys.executable, "-m", "fleetgen", "demo", "--gpus", "2",
                             "--prompts", str(prompts), "--out", str(out), "--tpot-ms", "10",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def results_size(out: Path) -> int:
    path = out / "results.jsonl"
    return path.stat().st_size if path.exists() else 0


def interrupt(prompts: Path, out: Path, signum: int) -> tuple[float, str, str]:
    """Start the demo, wait for it to write results beyond what `out` holds, signal it;
    returns the seconds from the signal to its exit, and its stdout and stderr."""
    before = results_size(out)
    proc = demo(prompts, out)
    wait_until(lambda: results_size(out) > before or proc.poll() is not None, 120,
             "the demo to write results")
    assert proc.poll() is None, proc.communicate()
    signalled = time.monotonic()
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - signalled
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    return took, stdout, stderr


def test_an_interrupted_demo_resumes_where_it_stopped(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "r{i}", "prompt": "question {i}"}}\n'
                               for i in range(ROWS)))
    out = tmp_path / "out"
    runs, kept = set(), b""
    for signum in (signal.SIGINT, signal.SIGTERM):
        took, stdout, stderr = interrupt(prompts, out, signum)
        print(f"\n{signal.Signals(signum).name}: exit 130 after {took:.2f} s")
        assert took < 2.0, f"{signal.Signals(signum).name}: {took:.2f} s to stop"
        summary = orjson.loads((out / "summary.json").read_bytes())
        assert summary["complete"] is False and summary["done"] > 0
        assert f"to resume run {summary['run']}" in stdout  # one line, the demo's own
        assert (stdout + stderr).count("fleetgen demo: interrupted") == 1, stdout + stderr
        runs.add(summary["run"])
        results = (out / "results.jsonl").read_bytes()
        assert results.startswith(kept), "a resume lost what the run had written"
        kept = results
    assert len(runs) == 1, f"each command started a run of its own: {runs}"

    proc = demo(prompts, out)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    assert "resuming run" in stdout
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["complete"] and summary["run"] in runs and summary["done"] == ROWS
    assert (out / "results.jsonl").read_bytes().startswith(kept)
    assert_exactly_once(out, {f"r{i}" for i in range(ROWS)})
    assert not (out / ".fleetgen-demo").exists(), "a complete run keeps no state to resume"

    # Complete: the same command starts a new run there, and an export of the old one goes.
    exported = subprocess.run([sys.executable, "-m", "fleetgen", "export", str(out),
                               "--format", "conversations"], capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    assert (out / "export.conversations.jsonl").exists()
    small = tmp_path / "small.jsonl"
    small.write_text('{"id": "s0", "prompt": "hello"}\n')
    again = demo(small, out)
    stdout, stderr = again.communicate(timeout=240)
    assert again.returncode == 0, stderr[-3000:]
    new = orjson.loads((out / "summary.json").read_bytes())
    assert new["run"] != summary["run"] and new["total"] == 1
    assert sorted(p.name for p in out.glob("export.*")) == [], "a stale export was left"
