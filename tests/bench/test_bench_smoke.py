"""Every bench still runs end to end at a tiny size (figures belong to `make bench`, not here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import ceiling, drain, fleet, memory, ordering, produce


@pytest.fixture(autouse=True)
def results_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The JSON of a real `make bench` run stays untouched.
    out = tmp_path / "results"
    monkeypatch.setattr("bench.common.RESULTS_DIR", out)
    return out


def _result(results_dir: Path, name: str) -> dict[str, Any]:
    return orjson.loads((results_dir / f"{name}.json").read_bytes())


def test_fleet_both_systems_write_every_row(results_dir: Path) -> None:
    assert fleet.main(["--rows", "40", "--gpus", "2", "--fleets", "equal"]) == 0
    by_system = {r["system"]: r for r in _result(results_dir, "fleet")["results"]}
    ours, seed = by_system["fleetgen"], by_system["seed baseline"]
    assert ours["completed"] + ours["rejected"] == 40 and ours["failed"] == 0
    assert seed["completed"] + seed["failed"] == 40
    assert ours["context_length_failures"] == 0
    assert 0 < ours["utilization"] <= 1.05 and ours["ideal_s"] > 0


def test_producer_drainer_memory_ceiling_ordering(results_dir: Path) -> None:
    assert produce.main(["--rows", "200"]) == 0
    assert _result(results_dir, "producer")["speedup"] > 0
    assert drain.main(["--rows", "2000", "--batches", "512", "--restart-rows", "3000"]) == 0
    assert _result(results_dir, "drainer")["results"][0]["stream_left"] == 0
    assert _result(results_dir, "drainer")["restart"]["rows"] == 3000
    assert memory.main(["--sizes", "300", "--valkey-rows", "300"]) == 0
    assert _result(results_dir, "memory")["valkey"]["written"] == 300
    assert ceiling.main(["--rows", "100", "--gpus", "2"]) == 0
    assert _result(results_dir, "ceiling")["done"] == 100
    assert ordering.main(["--rows", "200", "--seeds", "2"]) == 0
    assert len(_result(results_dir, "ordering")["ratios"]["input order"]) == 2
