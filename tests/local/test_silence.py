"""The supervisor's reading of its workers' heartbeats (fleetgen/local/silence.py) on a real
Valkey: the least silent live worker decides, a lost worker's beat and a missing one say
nothing, and a silence never counts from before the engine's last start."""

from __future__ import annotations

import time

import redis

from fleetgen.local.silence import WorkerSilence, stuck_for_s
from fleetgen.queue.contract import worker_key
from fleetgen.queue.heartbeat import fields


def beat(client: redis.Redis, name: str, silent_s: float, age_s: float = 0.0) -> None:
    client.hset(worker_key(name), mapping={"silent_s": silent_s, **fields(
        interval_s=2.0, lease_s=60.0, sweep_s=6.0, held=1, now=time.time() - age_s)})


def test_the_least_silent_live_worker_of_an_engine_decides(rclient: redis.Redis) -> None:
    workers = {0: ["gpu0p1@h", "gpu0p2@h"], 1: ["gpu1@h", "gone@h"], 2: []}
    beat(rclient, "gpu0p1@h", 75.0)
    beat(rclient, "gpu0p2@h", 12.5)
    beat(rclient, "gpu1@h", 90.0)
    beat(rclient, "lost@h", 0.0, age_s=30)  # three beats missed: says nothing
    workers[1].append("lost@h")
    silence = WorkerSilence(rclient, workers.__getitem__)
    assert sorted(silence.silences(0)) == [12.5, 75.0]
    assert silence.silences(1) == [90.0]
    assert silence.silences(2) == []
    assert stuck_for_s(silence.silences(0), ready_for_s=300) == 12.5
    assert stuck_for_s(silence.silences(1), ready_for_s=300) == 90.0
    assert stuck_for_s(silence.silences(1), ready_for_s=20) == 20  # restarted 20 s ago
    assert stuck_for_s(silence.silences(2), ready_for_s=300) == 0.0


def test_a_redis_that_cannot_be_read_is_no_silence() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    assert WorkerSilence(client, lambda i: ["gpu0@h"]).silences(0) == []
