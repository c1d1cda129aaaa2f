"""The health gate: a worker whose engine is not up yet takes no prompt and starts when the
engine answers; a slow /health never holds up prompts; a refused engine is gone only after
FLEETGEN_ENGINE_GONE_S, and then the worker hands back what it holds."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from fleetgen.local.ports import lease_port
from fleetgen.queue.contract import QUEUE, TaskPayload, worker_key
from fleetgen.runstate.keys import RunKeys
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import run_in_thread
from producer.enqueue import Enqueuer
from tests.support.waiting import wait_until
from tests.support.workers import heartbeat_key, start_worker, stop

# Starts real Celery worker processes: the fleet tier (tests/conftest.py).
pytestmark = pytest.mark.fleet


def test_worker_waits_for_its_engine_then_works(redis_url: str, tmp_path: Path) -> None:
    # Leased, not port 0: the worker must know the engine's URL before the engine exists.
    lease = lease_port()
    port = lease.port
    log = tmp_path / "worker.log"
    client = redis.Redis.from_url(redis_url)
    client.hset(RunKeys("gate").manifest, "state", "producing")  # a run the worker knows
    Enqueuer(client, "gate").send([TaskPayload(
        run="gate", line=1, id="g1", input_ids=[1, 2, 3], max_tokens=8, sampling={}, row={})])
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "fleetgen", "-n",
         "gate@%h", "-P", "threads", "-c", "2", "--without-mingle", "--without-gossip",
         "-l", "INFO"],
        env={"PATH": "/usr/bin:/bin", "FLEETGEN_REDIS_URL": redis_url,
             "FLEETGEN_ENGINE_URL": f"http://127.0.0.1:{port}",
             "FLEETGEN_HEALTH_INTERVAL_S": "0.5",
             # Celery's per-task lines (off by default) are what shows a task was taken.
             "FLEETGEN_TASK_LOG": "1"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    key = worker_key(f"gate@{socket.gethostname()}")
    try:
        wait_until(lambda: client.hget(key, "consuming") == b"0", 60, "the gate to close")
        wait_until(lambda: client.hget(key, "at") is not None, 5, "a heartbeat")
        # The engine is down: the prompt stays queued (not bounced, not failed).
        assert client.llen(QUEUE) == 1 and client.hlen("unacked") == 0
        assert not client.exists(RunKeys("gate").stream)
        assert "received" not in log.read_text()  # never even taken from the queue
        with run_in_thread(SimConfig(port=port, ttft_ms=1, tpot_ms=0)):
            wait_until(lambda: client.getbit(RunKeys("gate").done, 1) == 1, 30,
                       "the prompt to be generated once the engine is up")
            # The beat is its own thread's (workers/beat.py): it says the open gate within one
            # interval (0.5 s here), not in the gate's own step.
            wait_until(lambda: client.hget(key, "consuming") == b"1", 3, "the beat to say so")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        lease.close()
    assert client.xlen(RunKeys("gate").stream) == 1


def _payloads(run: str, n: int, max_tokens: int = 4) -> list[TaskPayload]:
    return [TaskPayload(run=run, line=i, id=f"{run}{i}", input_ids=[1, 2, i + 3],
                        max_tokens=max_tokens, sampling={}, row={}) for i in range(1, n + 1)]


def test_a_slow_health_endpoint_does_not_hold_up_prompts(redis_url: str, tmp_path: Path) -> None:
    # SGLang's /health is a generation probe (>= 1 s). A worker that probed it on Celery's
    # consumer loop could fetch no prompt while it waited; one prompt at a time (-c 1, prefetch
    # 1) makes every fetch visible as a gap between two outcomes.
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys("slowh")
    n = 30
    config = SimConfig(port=0, ttft_ms=20, tpot_ms=0, health_delay_s=1.5)
    with run_in_thread(config) as sim:
        proc = start_worker(redis_url, sim.url, "slowh", tmp_path / "w.log", concurrency=1,
                            env={"FLEETGEN_HEALTH_INTERVAL_S": "0.3"})
        key = heartbeat_key("slowh")
        try:
            wait_until(lambda: client.hget(key, "consuming") == b"1", 60, "the gate to open")
            client.hset(keys.manifest, "state", "producing")
            Enqueuer(client, "slowh").send(_payloads("slowh", n))
            beats: list[bytes | None] = []

            def done() -> bool:
                beats.append(client.hget(key, "consuming"))
                return int(client.xlen(keys.stream)) >= n

            wait_until(done, 120, "every prompt to be answered", poll_s=0.05)
        finally:
            stop(proc)
    stamps = [int(entry_id.split(b"-")[0]) for entry_id, _ in client.xrange(keys.stream)]
    gaps_ms = [b - a for a, b in itertools.pairwise(stamps)]
    # Each prompt takes ~20 ms; a fetch held up by a 1.5 s probe shows as a gap >= 1.5 s.
    assert max(gaps_ms) < 1000, gaps_ms
    assert set(beats) == {b"1"}, beats  # consuming throughout


def test_a_refused_engine_is_gone_only_after_the_threshold(redis_url: str,
                                                          tmp_path: Path) -> None:
    gone_s = 4.0
    lease = lease_port()
    port = lease.port
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys("gone")
    key = heartbeat_key("gone")
    env = {"FLEETGEN_HEALTH_INTERVAL_S": "0.2", "FLEETGEN_ENGINE_GONE_S": str(gone_s)}
    proc = start_worker(redis_url, f"http://127.0.0.1:{port}", "gone", tmp_path / "w.log",
                        concurrency=2, env=env)
    try:
        # Prompts that take a minute, so the worker certainly holds both when the server dies.
        sim = run_in_thread(SimConfig(port=port, ttft_ms=60_000, health_delay_s=0))
        try:
            client.hset(keys.manifest, "state", "producing")
            Enqueuer(client, "gone").send(_payloads("gone", 2))
            with httpx.Client(base_url=sim.url) as http:
                wait_until(lambda: http.get("/_sim/stats").json()["num_running_reqs"] == 2, 60,
                           "the server to run both prompts")
        finally:
            refused_at = time.time()
            sim.stop()  # connections dropped, port closed: every probe is refused
        beats: list[tuple[float, bytes | None]] = []

        def closed() -> bool:
            at = time.time()
            beats.append((at, client.hget(key, "consuming")))
            return beats[-1][1] == b"0"

        wait_until(closed, 60, "the gate to close", poll_s=0.05)
        closed_at = beats[-1][0]
        # A refusal shorter than the threshold is a blip: the worker kept consuming well
        # after the server went away, and closed the gate only past the threshold.
        assert any(c == b"1" and at > refused_at + 1.5 for at, c in beats), beats
        assert closed_at >= refused_at + gone_s - 0.5, (closed_at - refused_at)
        # What it held is back in the queue, with no outcome written.
        wait_until(lambda: client.llen(QUEUE) == 2 and client.hlen("unacked") == 0, 30,
                   "the held prompts to be handed back")
        assert client.xlen(keys.stream) == 0
        with run_in_thread(SimConfig(port=port, ttft_ms=1, tpot_ms=0, health_delay_s=0)):
            wait_until(lambda: client.xlen(keys.stream) == 2, 60, "both prompts once it is back")
            # The beat is its own thread's (workers/beat.py): it says the open gate within one
            # interval (0.2 s here), not in the gate's own step.
            wait_until(lambda: client.hget(key, "consuming") == b"1", 2, "the beat to say so")
    finally:
        stop(proc)
        lease.close()
    kinds = {fields[b"k"] for _, fields in client.xrange(keys.stream)}
    assert kinds == {b"result"}
