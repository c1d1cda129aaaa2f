"""`slurm/fleetgen.sbatch` on a real Slurm (tests/support/slurm.py: a controller and two nodes
of four fake GPUs on this host), simulators as the engines, 2,000 rows: `scancel` in the
middle leaves no process and the same line resubmitted completes the run, each row once; a
node's `fleetgen node` SIGKILLed mid-run takes its engines and workers with it, their prompts
come back through the leases and the run completes on the first node, each row once (both
nodes' workers wrote). Measured once with neither (2 busy cores): 2,000 rows in 39 s."""

from __future__ import annotations

import os
import signal
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

    def __init__(self, slurm: Slurm, tmp_path: Path, prompts: Path, name: str,
                 env: dict[str, str] | None = None) -> None:
        self.slurm, self.mark = slurm, new_mark()
        self.output = tmp_path / f"{name}.out"
        env = {**slurm.env, **self.mark, **QUICK_WORKERS,
               "FLEETGEN": f"{sys.executable} -m fleetgen", **(env or {})}
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


def test_a_killed_node_leaves_the_run_to_the_other(slurm: Slurm, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, ROWS)
    out = tmp_path / "out"
    # Leases of 10 s, not 60: what a killed worker held is back within a test's patience.
    job = Job(slurm, tmp_path, prompts, "job", env={"FLEETGEN_VISIBILITY_TIMEOUT_S": "10",
                                                    "FLEETGEN_HANDBACK_S": "5"})

    def node_pid() -> int | None:
        found = [int(p.split()[0]) for p in marked(job.mark) if " node --engine-cmd " in p]
        return found[0] if found else None

    wait_until(lambda: (written(out) >= 200 and node_pid()) or not job.running(), 300,
               "rows written with the node joined", poll_s=0.5)
    pid = node_pid()
    assert pid is not None and job.running(), job.text()[-4000:]
    os.kill(pid, signal.SIGKILL)
    at_kill = written(out)
    # Its engines and workers go with it (they die with their parent), not at the job's end.
    wait_until(lambda: not [p for p in marked(job.mark) if "n2-gpu" in p
                            or ".fleetgen-node/n2" in p], 30, "the killed node's processes gone")
    wall_s = job.wait(600)
    assert "fleetgen run: report at" in job.text(), job.text()[-4000:]
    assert "fleetgen node n2: joining the run" in job.text()
    data = assert_exactly_once(out, set(kinds["good"]))
    assert any(r["worker"].startswith("n2-gpu") for r in data["results"])
    assert marked(job.mark) == []
    print(f"\nsbatch -N2: fleetgen node SIGKILLed at {at_kill} rows; the run completed on n1 "
          f"in {wall_s:.0f} s, each row once")
