"""A real fleet for end-to-end tests: Valkey, simulated GPUs and Celery workers, per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetgen.local.fleet import FleetSpec, LocalFleet


@pytest.fixture(scope="module")
def fleet4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    fleet = LocalFleet(tmp_path_factory.mktemp("fleet4"),
                       FleetSpec(gpus=4, context_length=8192, max_running_requests=16,
                                 ttft_ms=5, tpot_ms=0.05, output_tokens_mean=300))
    fleet.start()
    yield fleet
    fleet.stop()


@pytest.fixture(scope="module")
def fleet2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """Two GPUs with short answers (60 tokens on average), for runs that check options."""
    fleet = LocalFleet(tmp_path_factory.mktemp("fleet2"),
                       FleetSpec(gpus=2, context_length=8192, max_running_requests=16,
                                 ttft_ms=5, tpot_ms=0.05, output_tokens_mean=60))
    fleet.start()
    yield fleet
    fleet.stop()


@pytest.fixture()
def out_dir(tmp_path: Path) -> Path:
    return tmp_path / "out"
