"""Several worker processes on one engine (FLEETGEN_ENGINE_SHARE=I/N): without -c they split
the engine's K + 1 threads between them, every row is written once, and each process's health
gate closes when the shared engine goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from fleetgen import exitcodes
from fleetgen.records.outcomes import read_entry
from fleetgen.runstate.keys import RunKeys
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import run_in_thread
from producer.enqueue import Enqueuer
from tests.support.tasks import payloads
from tests.support.waiting import wait_until
from tests.support.workers import assert_one_line_exit, heartbeat_key, start_worker, stop
from workers.startup import share_of

# Starts real Celery worker processes: the fleet tier (tests/conftest.py).
pytestmark = pytest.mark.fleet


@pytest.mark.parametrize(("total", "count", "expected"), [
    (7, 2, [4, 3]), (6, 2, [3, 3]), (33, 4, [9, 8, 8, 8]), (2, 3, [1, 1, 1]), (5, 1, [5])])
def test_shares_add_up_to_the_pool(total: int, count: int, expected: list[int]) -> None:
    assert [share_of(total, (i, count)) for i in range(1, count + 1)] == expected


def test_two_processes_share_one_engine(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    keys, n = RunKeys("shared"), 300
    env = {"FLEETGEN_HEALTH_INTERVAL_S": "0.2", "FLEETGEN_ENGINE_GONE_S": "1"}
    names = ["share1", "share2"]
    sim = run_in_thread(SimConfig(port=0, max_running_requests=6, ttft_ms=2, tpot_ms=0,
                                  health_delay_s=0))
    procs = [start_worker(redis_url, sim.url, name, tmp_path / f"{name}.log",
                          env={**env, "FLEETGEN_ENGINE_SHARE": f"{i}/2"})
             for i, name in enumerate(names, start=1)]
    try:
        beats = [heartbeat_key(name) for name in names]
        wait_until(lambda: all(client.exists(b) for b in beats), 60, "both heartbeats")
        # K = 6: K + 1 = 7 threads in all, split 4 + 3.
        assert [client.hget(b, "concurrency") for b in beats] == [b"4", b"3"]
        client.hset(RunKeys("shared").manifest, "state", "producing")  # workers drop unknown runs
        Enqueuer(client, "shared").send(payloads("shared", n))
        wait_until(lambda: int(client.hget(keys.stats, "done") or 0) >= n, 120,
                 "every prompt to be answered")
        per_worker = [_done_of(client, keys, name) for name in names]
        assert sum(per_worker) == n and min(per_worker) > 0, per_worker
        records = [_record(f) for _, f in client.xrange(keys.stream)]
        assert sorted(r["line"] for r in records) == list(range(1, n + 1))  # each once
        # The engine goes: the gate of each process sharing it closes.
        sim.stop()
        wait_until(lambda: all(client.hget(b, "consuming") == b"0" for b in beats), 60,
                 "every process's gate to close")
    finally:
        sim.stop()
        for proc in procs:
            stop(proc)


def _record(fields: dict[bytes, bytes]) -> dict[str, Any]:
    entry = read_entry(fields)
    assert entry is not None
    return dict(orjson.loads(entry[1]))


def _done_of(client: redis.Redis, keys: RunKeys, name: str) -> int:
    for field, value in client.hgetall(keys.stats).items():
        if field.decode().startswith(f"{name}@") and field.endswith(b"|done"):
            return int(value)
    return 0


def test_a_malformed_share_is_one_line(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    proc = start_worker(redis_url, "http://127.0.0.1:9", "bad", log,
                        env={"FLEETGEN_ENGINE_SHARE": "3/2"})
    try:
        code = proc.wait(timeout=60)
    finally:
        stop(proc)
    assert_one_line_exit(log, code, exitcodes.CONFIG, "FLEETGEN_ENGINE_SHARE")
