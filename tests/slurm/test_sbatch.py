"""`slurm/fleetgen.sbatch` on a real Slurm (tests/support/slurm.py: a controller and two nodes
of four fake GPUs on this host), simulators as the engines: `sbatch -N2` completes a run of
2,000 rows, each once, with both nodes' workers writing; `scancel` in the middle leaves no
process and whole output lines, and the same line resubmitted completes the run, each row
once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.binaries import require_binary
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.slurm import DAEMONS, Slurm
from tests.support.survivors import marked, new_mark
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "slurm" / "fleetgen.sbatch"
SIM = (f"{sys.executable} -m fleetgen.simulator --port {{port}} --max-running-requests 16 "
       "--tpot-ms 1 --output-tokens-mean 40 --context-length 4096 --ttft-ms 0")
ROWS = 2000
QUICK_WORKERS = {"FLEETGEN_HEALTH_INTERVAL_S": "1", "FLEETGEN_ENGINE_GONE_S": "3"}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    for name in DAEMONS:
        require_binary(name, why="the Slurm tier (apt-get install slurmctld slurmd "
                       "slurm-client munge)")
    if os.geteuid() != 0:
        pytest.skip("a Slurm of its own needs root (slurmd, munged, mknod)")
    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


class Job:
    """One `sbatch` of the script, with a mark every process it starts inherits."""

    def __init__(self, slurm: Slurm, tmp_path: Path, prompts: Path, name: str) -> None:
        self.slurm, self.mark = slurm, new_mark()
        self.output = tmp_path / f"{name}.out"
        env = {**slurm.env, **self.mark, **QUICK_WORKERS,
               "FLEETGEN": f"{sys.executable} -m fleetgen"}
        done = subprocess.run(
            ["sbatch", "--parsable", "-N2", "--gres=gpu:4", f"--output={self.output}",
             f"--chdir={tmp_path}", str(SCRIPT), str(prompts), str(tmp_path / "out"), SIM],
            env=env, capture_output=True, text=True, timeout=60, check=True)
        self.id = done.stdout.strip().split(";")[0]
        self.started = time.monotonic()

    def running(self) -> bool:
        return bool(self.slurm.run("squeue", "-h", "-j", self.id).stdout.strip())

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def wait(self, timeout_s: float) -> float:
        wait_until(lambda: not self.running(), timeout_s, f"job {self.id} to end",
                   poll_s=0.5, check=None)
        return time.monotonic() - self.started


def written(out: Path) -> int:
    path = out / "results.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_two_nodes_complete_a_run_each_row_once(slurm: Slurm, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, ROWS)
    job = Job(slurm, tmp_path, prompts, "job")
    wall_s = job.wait(600)
    text = job.text()
    assert "fleetgen run: report at" in text, text[-4000:]
    data = assert_exactly_once(tmp_path / "out", set(kinds["good"]))
    by_node = {w.split("-gpu")[0] if "-gpu" in w else "n1"
               for w in (r["worker"] for r in data["results"])}
    assert by_node == {"n1", "n2"}, by_node
    assert "fleetgen node n2: run " in text and "is complete; stopping its engines" in text
    assert marked(job.mark) == []
    print(f"\nsbatch -N2 (8 simulated GPUs): {ROWS} rows complete in {wall_s:.0f} s")


def test_scancel_then_the_same_line_resumes(slurm: Slurm, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, ROWS)
    out = tmp_path / "out"
    first = Job(slurm, tmp_path, prompts, "first")
    wait_until(lambda: written(out) >= 200 or not first.running(), 300,
               "the first job writing rows", poll_s=0.5)
    assert first.running(), first.text()[-4000:]
    slurm.run("scancel", first.id)
    cancelled_at = time.monotonic()
    first.wait(90)
    gone_s = time.monotonic() - cancelled_at
    wait_until(lambda: not marked(first.mark), 40, "no process of the cancelled job")
    at_cancel = written(out)
    assert 0 < at_cancel < ROWS
    again = Job(slurm, tmp_path, prompts, "again")
    again.wait(600)
    assert "resuming run" in again.text(), again.text()[-4000:]
    assert_exactly_once(out, set(kinds["good"]))
    assert marked(again.mark) == []
    print(f"\nscancel: the job gone {gone_s:.1f} s later with {at_cancel} rows written; "
          f"resubmitted, it completed the other {ROWS - at_cancel}, each row once")
