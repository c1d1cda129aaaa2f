"""`fleetgen demo`: the README's first command, on a small set; it cleans up after itself."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import psutil

from fleetgen.cli.demo import sample_prompts
from fleetgen.local.simgpus import SimGpus
from tests.support.content import assert_fleet_content
from tests.support.pipeline import read_output
from tests.support.waiting import wait_until


def demo_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetgen", "demo", *args]


def children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_demo_runs_the_bundled_sample_and_stops_everything(tmp_path: Path) -> None:
    # As a user runs it first: in a fresh working directory, the default (relative) --out.
    # --gpus 2, not 8: the suite shares 2 cores; `.ci/run` runs `make demo` at the defaults.
    out = tmp_path / "out" / "demo"
    proc = subprocess.Popen(demo_argv("--gpus", "2"), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[psutil.Process] = []
    wait_until(lambda: len(children_of(proc.pid)) >= 4 or proc.poll() is not None, 60,
               "the demo's processes")
    seen = children_of(proc.pid)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    summary = orjson.loads((out / "summary.json").read_bytes())
    rows = sample_prompts().read_bytes().count(b"\n")
    assert summary["complete"] and summary["total"] == rows
    assert summary["done"] + summary["rejected"] == rows and summary["failed"] == 0
    assert summary["rejected"] >= 8  # too-long and malformed rows ship in the sample
    assert "completion tokens/s" in stdout
    # The last line names the report, written beside the output files.
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("fleetgen demo: report at out/demo/report.html")
    assert b"uPlot" in (out / "report.html").read_bytes()
    # Every answer is the one the demo's simulators (its defaults: 8192 context, 32 slots,
    # 200-token mean, seed 0) give for that row: simulated GPUs of the same settings, never
    # started, name their config.
    demo_gpus = SimGpus(gpus=2, context_length=8192, max_running_requests=32, tpot_ms=1.0,
                        output_tokens_mean=200)
    results = read_output(out)["results"]
    assert assert_fleet_content(demo_gpus, sample_prompts(), results) == summary["done"]
    assert seen and not [p for p in seen if p.is_running() and p.status() != "zombie"]


def test_demo_interrupted_stops_every_process(tmp_path: Path) -> None:
    prompts = tmp_path / "many.jsonl"
    prompts.write_text("".join(f'{{"id": "r{i}", "prompt": "question {i}"}}\n'
                               for i in range(3000)))
    proc = subprocess.Popen(demo_argv("--gpus", "2", "--prompts", str(prompts), "--out",
                                      str(tmp_path / "out"), "--tpot-ms", "20"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: (tmp_path / "out" / "results.jsonl").exists()
               and (tmp_path / "out" / "results.jsonl").stat().st_size > 0, 120,
               "the demo to write results")
    seen = children_of(proc.pid)
    assert len(seen) >= 4
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=180)  # workers finish what they hold first
    assert proc.returncode == 130, stderr[-2000:]
    # One line says how to resume (the demo's own), not a second one from main.
    assert (stdout + stderr).count("fleetgen demo: interrupted") == 1, stdout + stderr
    assert "to resume run" in stdout
    assert "Traceback" not in stderr
    assert not [p for p in seen if p.is_running() and p.status() != "zombie"]
