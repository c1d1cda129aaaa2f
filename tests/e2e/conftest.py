"""Real fleets for end-to-end tests: Valkey, simulated GPUs and Celery workers, one of each
shape per session, shared by the modules that ask for it (each test its own run names; no
test here breaks a fleet: the chaos tests, which do, get fleets of their own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetgen.local.fleet import LocalFleet
from tests.support.fleet import started_fleet


@pytest.fixture(scope="session")
def fleet4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    yield from started_fleet(tmp_path_factory.mktemp("fleet4"), gpus=4, output_tokens_mean=300)


@pytest.fixture(scope="session")
def fleet2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """Two GPUs with short answers (60 tokens on average), for runs that check options."""
    yield from started_fleet(tmp_path_factory.mktemp("fleet2"), gpus=2, output_tokens_mean=60)


@pytest.fixture()
def out_dir(tmp_path: Path) -> Path:
    return tmp_path / "out"
