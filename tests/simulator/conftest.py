"""Fixtures for the simulator tests: fleets on free ports in a background thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from simulator import SimConfig, SimThread, run_in_thread
from tests.simulator.sim_helpers import StartSim


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Start a fleet with SimConfig overrides; instant by default (no ttft, tpot, health wait)."""
    handles: list[SimThread] = []

    def start(**overrides: object) -> SimThread:
        settings: dict[str, object] = {
            "port": 0, "ttft_ms": 0.0, "tpot_ms": 0.0, "health_delay_s": 0.0,
        }
        settings.update(overrides)
        handle = run_in_thread(SimConfig(**settings))  # type: ignore[arg-type]
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()
