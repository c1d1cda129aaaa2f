"""A worker whose engine is not up yet takes no prompt, and starts when the engine answers."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import redis

from fleetgen.base.contract import QUEUE, RunKeys, TaskPayload, worker_key
from fleetgen.local.ports import lease_port
from fleetgen.local.procs import wait_for
from producer.enqueue import Enqueuer
from simulator.config import SimConfig
from simulator.server import run_in_thread


def test_worker_waits_for_its_engine_then_works(redis_url: str, tmp_path: Path) -> None:
    # Leased, not port 0: the worker must know the engine's URL before the engine exists.
    lease = lease_port()
    port = lease.port
    log = tmp_path / "worker.log"
    client = redis.Redis.from_url(redis_url)
    Enqueuer(client, "gate").send([TaskPayload(
        run="gate", line=1, id="g1", input_ids=[1, 2, 3], max_tokens=8, sampling={}, row={})])
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "fleetgen", "-n",
         "gate@%h", "-P", "threads", "-c", "2", "--without-mingle", "--without-gossip",
         "-l", "INFO"],
        env={"PATH": "/usr/bin:/bin", "FLEETGEN_REDIS_URL": redis_url,
             "FLEETGEN_ENGINE_URL": f"http://127.0.0.1:{port}",
             "FLEETGEN_HEALTH_INTERVAL_S": "0.5"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    key = worker_key(f"gate@{socket.gethostname()}")
    try:
        wait_for(lambda: client.hget(key, "consuming") == b"0", 60, "the gate to close")
        wait_for(lambda: client.hget(key, "at") is not None, 5, "a heartbeat")
        # The engine is down: the prompt stays queued (not bounced, not failed).
        assert client.llen(QUEUE) == 1 and client.hlen("unacked") == 0
        assert not client.exists(RunKeys("gate").stream)
        assert "received" not in log.read_text()  # never even taken from the queue
        with run_in_thread(SimConfig(port=port, ttft_ms=1, tpot_ms=0)):
            wait_for(lambda: client.getbit(RunKeys("gate").done, 1) == 1, 30,
                     "the prompt to be generated once the engine is up")
            assert client.hget(key, "consuming") == b"1"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        lease.close()
    assert client.xlen(RunKeys("gate").stream) == 1
