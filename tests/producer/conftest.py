"""Fixtures for producer tests that read a server's limits: simulated SGLang servers over real
HTTP, on ports of the kernel's choosing, stopped after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from simulator import SimConfig, SimThread, run_in_thread

StartSim = Callable[..., SimThread]


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Start a simulated server with SimConfig overrides; instant answers by default."""
    handles: list[SimThread] = []

    def start(**overrides: object) -> SimThread:
        settings: dict[str, object] = {"port": 0, "ttft_ms": 0.0, "tpot_ms": 0.0,
                                       "health_delay_s": 0.0, "output_tokens_mean": 8}
        settings.update(overrides)
        handle = run_in_thread(SimConfig(**settings))  # type: ignore[arg-type]
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()
