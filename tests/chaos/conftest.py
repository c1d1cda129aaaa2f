"""Fleets that tests may break: each test gets its own Valkey, simulators and workers (never
shared: a test kills and restarts their processes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetgen.local.fleet import LocalFleet
from tests.support.fleet import CHAOS_SPEC, FleetFactory, sim_fleet


@pytest.fixture()
def make_fleet(tmp_path: Path) -> Iterator[FleetFactory]:
    fleets: list[LocalFleet] = []

    def factory(**overrides: Any) -> LocalFleet:
        fleet = sim_fleet(tmp_path / f"fleet{len(fleets)}", **{**CHAOS_SPEC, **overrides})
        fleets.append(fleet)
        return fleet.start()

    yield factory
    for fleet in fleets:
        fleet.stop()
