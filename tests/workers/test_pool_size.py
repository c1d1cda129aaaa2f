"""A worker started without -c sizes its pool from the engine's running-request slots."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from fleetgen.base.contract import worker_key
from fleetgen.local.procs import wait_for
from simulator.config import SimConfig
from simulator.server import SimThread, run_in_thread


@pytest.fixture()
def sim() -> Iterator[SimThread]:
    with run_in_thread(SimConfig(port=0, max_running_requests=5)) as handle:
        yield handle


def test_pool_is_slots_plus_one_without_c(redis_url: str, sim: SimThread) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "fleetgen", "-n",
         "auto@%h", "-P", "threads", "--without-mingle", "--without-gossip"],
        env={"PATH": "/usr/bin:/bin", "FLEETGEN_REDIS_URL": redis_url,
             "FLEETGEN_ENGINE_URL": sim.url, "FLEETGEN_HEALTH_INTERVAL_S": "0.5"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis.from_url(redis_url)
        key = worker_key(f"auto@{socket.gethostname()}")
        wait_for(lambda: client.exists(key) == 1, 60, "the worker's heartbeat")
        assert client.hget(key, "concurrency") == b"6"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
