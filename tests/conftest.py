"""Shared fixtures: a real Valkey per session on a leased port, a clean DB per test; and the
one rule for tests that need a system package."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleetgen.base import envvars
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.simulator import SimConfig, SimThread, run_in_thread
from tests.simulator.sim_helpers import StartSim

# A suite started in the background (`nohup make flaky &`, a CI step in a background job)
# inherits SIGINT ignored, and every child it starts would too: the demo then ignores the
# Ctrl-C that tests/e2e/test_demo.py sends it and the test times out (found by `make flaky`).
# A handler, unlike SIG_IGN, does not survive exec: children start with SIGINT's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Set by .ci/run, which installs every system package the suite needs: there a missing one is
# a broken CI image, and a skip would hide it behind a green run.
CI_FLAG = envvars.CI.name


def require_binary(name: str, path: str | None = None, why: str = "") -> str:
    """The path of executable `name` (or of `path`, if given). Missing: a skip on a
    developer's machine, a failure under FLEETGEN_CI=1."""
    found = path if path and os.access(path, os.X_OK) else (None if path else shutil.which(name))
    if found:
        return found
    reason = f"{path or name} missing{': ' + why if why else ''} (.ci/run installs it)"
    if os.environ.get(CI_FLAG) == "1":
        pytest.fail(f"{reason}; {CI_FLAG}=1 turns this skip into a failure", pytrace=False)
    pytest.skip(reason)


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


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


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


# The folders whose tests start real processes of the product (Celery workers, a LocalFleet,
# llama.cpp, Flower, the demo): the slow tier, left out of `make check`.
FLEET_FOLDERS = frozenset({"e2e", "chaos", "ops", "engines", "workers", "bench"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        parts = Path(item.path).relative_to(root).parts
        if parts and parts[0] in FLEET_FOLDERS:
            item.add_marker(pytest.mark.fleet)

