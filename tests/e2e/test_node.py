"""`fleetgen node` joins a `fleetgen run --listen` with engines of its own, from the line the
run prints: its workers write rows, it exits 0 once the run is complete, its engines stopped,
and neither command leaves a process behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from fleetgen.base import exitcodes
from fleetgen.local.ports import lease_port
from tests.support.cli import fleetgen_cli
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.survivors import marked, new_mark
from tests.support.waiting import wait_until

SIM = (f"{sys.executable} -m fleetgen.simulator --port {{port}} --max-running-requests 8 "
       "--tpot-ms 5 --output-tokens-mean 150 --context-length 4096 --ttft-ms 0")
QUICK_WORKERS = {"FLEETGEN_HEALTH_INTERVAL_S": "1", "FLEETGEN_ENGINE_GONE_S": "3"}


def test_a_node_joins_a_listening_run_and_leaves_when_it_is_complete(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, 300)
    with lease_port() as lease:
        port = lease.port
    run_mark, node_mark = new_mark(), new_mark()
    base = {**os.environ, **QUICK_WORKERS, "CUDA_VISIBLE_DEVICES": "0,1"}
    run_log, node_log = tmp_path / "run.log", tmp_path / "node.log"
    with run_log.open("wb") as sink:
        run = subprocess.Popen(
            fleetgen_cli("run", str(prompts), "--engine-cmd", SIM, "--gpus", "0", "--out",
                         "out", "--listen", f"127.0.0.1:{port}"),
            cwd=tmp_path, env={**base, **run_mark}, stdout=sink, stderr=subprocess.STDOUT)
    node: subprocess.Popen[bytes] | None = None
    try:
        line = wait_until(lambda: re.search(
            r"FLEETGEN_REDIS_URL=(\S+) fleetgen node --run (\S+) --engine-cmd (.+)$",
            run_log.read_text(), re.MULTILINE) or run.poll(), 120, "the line for other hosts")
        assert isinstance(line, re.Match), run_log.read_text()
        url, name = line.group(1), line.group(2)
        with node_log.open("wb") as sink:
            node = subprocess.Popen(
                fleetgen_cli("node", "--run", name, "--engine-cmd", SIM, "--gpus", "1"),
                cwd=tmp_path, env={**base, **node_mark, "FLEETGEN_REDIS_URL": url,
                                   "SLURMD_NODENAME": "n2"},
                stdout=sink, stderr=subprocess.STDOUT)
        assert run.wait(timeout=300) == exitcodes.OK, run_log.read_text()[-3000:]
        assert node.wait(timeout=60) == exitcodes.OK, node_log.read_text()[-3000:]
    finally:
        for proc in (run, node):
            if proc is not None and proc.poll() is None:
                proc.kill()
    said = node_log.read_text()
    assert "fleetgen node n2: engine0 (http://127.0.0.1:" in said and "ready after" in said
    assert f"fleetgen node n2: run {name} is complete; stopping its engines" in said
    assert (tmp_path / ".fleetgen-node" / "n2" / "engines" / "engine0.log").exists()
    data = assert_exactly_once(tmp_path / "out", set(kinds["good"]))
    by_node = sum(r["worker"].startswith("n2-gpu0@") for r in data["results"])
    assert by_node > 0, "the node's worker wrote nothing"
    assert marked(run_mark) == [] and marked(node_mark) == []
    print(f"\nfleetgen node: its worker wrote {by_node} of {len(data['results'])}")
