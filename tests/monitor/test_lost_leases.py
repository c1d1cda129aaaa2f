"""What `status` says of prompts whose lease no live worker renews (a worker SIGKILLed or
frozen): counted from kombu's unacked index, not from the dead worker's last heartbeat (it may
have taken more after it), with when the last of them is back in the queue. A real Valkey."""

from __future__ import annotations

import time

import orjson
import redis

from fleetgen.monitor.status import gather, render
from fleetgen.queue.contract import TaskPayload, worker_key
from fleetgen.queue.heartbeat import fields
from fleetgen.queue.wire import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, LEASES, held_key, task_message
from fleetgen.runstate.keys import RunKeys


def held(client: redis.Redis, tag: str, run: str, line: int, delivered_at: float) -> None:
    payload = TaskPayload(run=run, line=line, id=f"r{line}", input_ids=[1, 2], max_tokens=8,
                          sampling={}, row={})
    message = orjson.loads(task_message(payload))
    client.hset(KOMBU_UNACKED, tag, orjson.dumps([message, "", "fleetgen"]))
    client.zadd(KOMBU_UNACKED_INDEX, {tag: delivered_at})


def test_unrenewed_leases_are_what_lost_workers_hold(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    run, now = "lost-leases", time.time()
    client.hset(RunKeys(run).manifest, mapping={"state": "produced", "total": 4,
                                                "started_at": now - 100})
    # A live worker that renewed its lease a second ago, and one dead 20 s ago.
    for name, at in (("gpu0@h", now - 1), ("gpu1@h", now - 20)):
        client.hset(worker_key(name), mapping={"healthy": 1, "consuming": 1, **fields(
            interval_s=2.0, lease_s=60.0, sweep_s=6.0, held=1, now=at)})
    held(client, "live", run, 1, now - 1)
    held(client, "dead-a", run, 2, now - 20)
    held(client, "dead-b", run, 3, now - 25)  # taken after its worker's last beat, or before
    held(client, "other-run", "another", 1, now - 30)
    # fleetgen's own transport: a tag under its holder's lease (fleetgen/queue/broker.py), the
    # holder's last renewal 22 s ago; and a live holder's, renewed a second ago.
    for holder, tag, line, renewed in (("dead-holder", "dead-c", 4, now - 22),
                                       ("live-holder", "live-c", 5, now - 1)):
        held(client, tag, run, line, float("inf"))
        client.sadd(held_key(holder), tag)
        client.zadd(LEASES, {holder: renewed})
    status = gather(client, run, now=now)
    assert status is not None
    assert status.lost_held == 3  # not the live ones, not another run's
    # The later of the two leases lapses 60 s after it was renewed, then one sweep (6 s).
    assert status.lost_back_in_s == 46.0
    lost = {w.name: w.health for w in status.workers}
    assert lost["gpu1@h"].startswith("LOST") and lost["gpu0@h"] == "ok"
    text = render(status)
    waiting = "WAITING 3 prompt(s) held by lost worker(s) gpu1@h: back in the queue within"
    assert waiting in text, text
    client.delete(LEASES, held_key("dead-holder"), held_key("live-holder"))
    for tag in ("live", "dead-a", "dead-b", "other-run", "dead-c", "live-c"):
        client.hdel(KOMBU_UNACKED, tag)
        client.zrem(KOMBU_UNACKED_INDEX, tag)
