"""Fleets that tests may break: each test gets its own Valkey, simulators and workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetgen.local.fleet import FleetSpec, LocalFleet

FleetFactory = Callable[..., LocalFleet]

# Requests of ~0.2-0.6 s: long enough that a kill lands mid-run, short enough for CI.
BASE = {"gpus": 3, "context_length": 4096, "max_running_requests": 8, "ttft_ms": 20.0,
        "tpot_ms": 1.0, "output_tokens_mean": 250}


@pytest.fixture()
def make_fleet(tmp_path: Path) -> Iterator[FleetFactory]:
    fleets: list[LocalFleet] = []

    def factory(**overrides: Any) -> LocalFleet:
        spec = FleetSpec(**{**BASE, **overrides})
        fleet = LocalFleet(tmp_path / f"fleet{len(fleets)}", spec)
        fleets.append(fleet)
        return fleet.start()

    yield factory
    for fleet in fleets:
        fleet.stop()


def sim_stats(fleet: LocalFleet) -> list[dict[str, Any]]:
    return [httpx.get(fleet.engine_url(g) + "/_sim/stats", timeout=5).json()
            for g in range(fleet.spec.gpus)]


def generated(fleet: LocalFleet) -> int:
    """Completions the simulators served (HTTP 200 on /generate) across the fleet."""
    return sum(int(s["requests_total"].get("200", 0)) for s in sim_stats(fleet))
