"""`fleetgen retry`: failed rows go back to work; a success moves from failures to results."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.content import assert_fleet_content
from tests.support.fleet import FleetFactory
from tests.support.pipeline import (
    assert_exactly_once,
    drain,
    make_prompts,
    read_output,
    run_pipeline,
)


@pytest.mark.parametrize("samples", [1, 2])
def test_retry_moves_rows_from_failures_to_results(samples: int, make_fleet: FleetFactory,
                                                   tmp_path: Path) -> None:
    """With --n 2 every sample is a request of its own: failed, retried and written once."""
    # One attempt per delivery and a server failing 30 % of requests: many rows fail.
    fleet = make_fleet(sim_args=["--error-rate", "0.3"],
                       worker_env={"FLEETGEN_MAX_ATTEMPTS": "1"})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 200 // samples)
    expected = set(kinds["good"]) if samples == 1 else \
        {f"{i}#{k}" for i in kinds["good"] for k in range(samples)}
    run_pipeline(fleet, prompts, "retry", out, n=samples)
    failed = len(read_output(out)["failures"])
    assert failed > 20
    history = [failed]
    for _ in range(15):
        done = subprocess.run([sys.executable, "-m", "fleetgen", "retry", "--run", "retry",
                               "--redis", fleet.redis_url], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        drain(fleet, "retry", out, timeout_s=60)
        history.append(len(read_output(out)["failures"]))
        assert_exactly_once(out, expected)  # holds after every round
        if history[-1] == 0:
            break
    assert history[-1] == 0, history
    assert all(a >= b for a, b in itertools.pairwise(history)), history
    data = read_output(out)
    assert len(data["results"]) == 200
    assert_fleet_content(fleet, prompts, data)
    done = subprocess.run([sys.executable, "-m", "fleetgen", "retry", "--run", "retry",
                           "--redis", fleet.redis_url], capture_output=True, text=True)
    assert "no failed rows" in done.stdout
