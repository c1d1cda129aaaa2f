"""Shared fixtures: a real Valkey per session on a leased port, a clean DB per test, simulated
servers in this process; and the tiers (markers by folder). Helpers live in tests/support."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.simulator import SimConfig, SimThread, run_in_thread
from tests.support.sim import StartSim
from tests.support.tiers import FLEET_FOLDERS

# A suite started in the background (`nohup make flaky &`, a CI step in a background job)
# inherits SIGINT ignored, and every child it starts would too: the demo then ignores the
# Ctrl-C that tests/e2e/test_demo.py sends it and the test times out (found by `make flaky`).
# A handler, unlike SIG_IGN, does not survive exec: children start with SIGINT's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedValkey]:
    server = EmbeddedValkey(tmp_path_factory.mktemp("valkey")).start()
    yield server
    server.stop()


@pytest.fixture()
def redis_url(valkey: EmbeddedValkey) -> str:
    client = redis.Redis.from_url(valkey.url)
    client.flushall()
    return valkey.url


@pytest.fixture()
def rclient(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    """Simulated servers in this process (a thread), with SimConfig overrides; instant by
    default (no ttft, tpot, health wait)."""
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


OWN_MARKERS = {"chaos": "chaos", "real_engines": "real_engines", "trainers": "trainers"}


# The folders whose modules take longest (a serial run's durations, docs/testing.md), run
# first: with `-n N --dist loadscope` a process takes the next module when it is free, so long
# modules started last leave the other processes idle at the end. The rest keep their order.
LONG_FIRST = ("chaos", "e2e", "ops", "trainers", "workers", "bench", "real_engines", "producer")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent

    def folder(item: pytest.Item) -> str:
        parts = Path(item.path).relative_to(root).parts
        return parts[0] if len(parts) > 1 else ""

    for item in items:
        if folder(item) in FLEET_FOLDERS:
            item.add_marker(pytest.mark.fleet)
        if folder(item) in OWN_MARKERS:
            item.add_marker(getattr(pytest.mark, OWN_MARKERS[folder(item)]))
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(folder(item), len(LONG_FIRST)))  # stable
