"""The Celery wire format, in one place: the Redis list entry of a task message (built without
Celery, for speed), its parsing, and where kombu keeps the messages a worker holds unacked."""

from __future__ import annotations

import base64
import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import redis

from fleetgen.queue.contract import AFFINITY_PREFIX, PREFIX, QUEUE, TASK_NAME, TaskPayload, slot_of
from fleetgen.queue.redisconn import text

# kombu's Redis transport keeps each delivered, not yet acked message in this hash as
# [message, exchange, routing_key] (kombu/transport/redis.py, QoS.unacked_key).
KOMBU_UNACKED = "unacked"
# ... and each one's delivery time, by delivery tag, for its visibility-timeout sweep (+inf
# for a message of fleetgen's transport: its holder's lease decides, below).
KOMBU_UNACKED_INDEX = "unacked_index"
# fleetgen's leases (fleetgen/queue/broker.py `QoS`): each holder (a worker's channel) -> Valkey's
# time of its last renewal, and the set of the tags it holds.
LEASES = f"{PREFIX}:leases"


# ... and what each unacked message is, by delivery tag: "<slot> <run>", ~50 bytes where the
# unacked copy is ~4.6 KB, so the reconciliation reads what is in flight without reading the
# messages (`slots_in_flight`).
IN_FLIGHT = f"{PREFIX}:inflight"


# Set for most of a sweep period by the sweep that finds it unset (fleetgen/queue/broker.py
# `QoS.restore_visible`): the fleet sweeps about once a period, not once a period a worker.
SWEEP_DUE = f"{PREFIX}:sweep-due"


def held_key(holder: str) -> str:
    return f"{PREFIX}:held:{holder}"


def taking_key(holder: str) -> str:
    """The list a holder takes messages into (fleetgen/queue/broker.py `_TAKE`): each is there
    from its take until the holder records it as held, so a take whose reply is lost (a cut
    network, a worker killed) leaves the message in Valkey, under the holder's name."""
    return f"{PREFIX}:taking:{holder}"


def routing_key(raw: bytes | str) -> str | None:
    """The queue a raw queue entry (a kombu message as JSON) was published to, or None."""
    try:
        key = orjson.loads(raw)["properties"]["delivery_info"]["routing_key"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return key if isinstance(key, str) and key else None


def in_flight_entry(body: Any) -> str | None:
    """The IN_FLIGHT value of a task's decoded body (protocol 2: [args, kwargs, embed]), or None
    if it is not fleetgen's task."""
    try:
        payload = body[0][0]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(payload, dict) or "run" not in payload:
        return None
    return f"{slot_of(payload)} {payload['run']}"

# Celery's canvas fields of a plain task call (protocol 2 body: [args, kwargs, embed]).
_EMBED: dict[str, None] = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"


def task_message(payload: TaskPayload, queue: str = QUEUE, priority: int = 0) -> bytes:
    """The Redis list entry kombu would write for `send_task(TASK_NAME, args=[payload])`:
    a Celery protocol-2 message in kombu's JSON envelope, byte for byte the same shape.

    Built here because Celery's own path costs ~2.4 ms a message on this machine (half of
    it `saferepr` of the token ids for `argsrepr`, the rest one LPUSH round trip each, as
    `send_task` does not use kombu's publish batch); this costs ~15 µs. The e2e tests run
    real Celery workers on these messages.
    """
    task_id = str(uuid.uuid4())
    body = orjson.dumps([[payload], {}, _EMBED])
    # argsrepr is what Flower and the worker's log show: the row, not 300 token ids.
    sample = f", 'sample': {payload['sample']}" if "sample" in payload else ""
    argsrepr = (f"[{{'run': {payload['run']!r}, 'line': {payload['line']}{sample}, "
                f"'id': {payload['id']!r}, 'prompt_tokens': {len(payload['input_ids'])}, "
                f"'max_tokens': {payload['max_tokens']}}}]")
    return orjson.dumps({
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": TASK_NAME, "id": task_id, "shadow": None, "eta": None,
            "expires": None, "group": None, "group_index": None, "retries": 0,
            "timelimit": [None, None], "root_id": task_id, "parent_id": None,
            "argsrepr": argsrepr, "kwargsrepr": "{}", "origin": _ORIGIN,
            "ignore_result": None, "replaced_task_nesting": 0, "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id, "reply_to": None, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue}, "priority": priority,
            "body_encoding": "base64", "delivery_tag": str(uuid.uuid4()),
        },
    })


def task_payload(message: Any) -> dict[str, Any] | None:
    """The payload inside a kombu/Celery protocol-2 message, or None if not ours."""
    try:
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = orjson.loads(body)[0]
        payload = args[0]
        return payload if isinstance(payload, dict) else None
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def slots_in_flight(client: redis.Redis, run: str) -> set[int]:
    """Slots (requests) of `run` now in the queue or held unacked by a worker. Both are bounded
    by the high-water mark and the fleet's concurrency, and both are read in pages (LRANGE of
    SCAN_PAGE messages, scripts of 1,024 entries), so no reply and no step of Valkey's is the
    whole of either. The held ones come from IN_FLIGHT (fleetgen's transport writes it with
    each unacked copy): at 129,000 in flight that is ~6 MB read, not the copies' ~600 MB. A
    copy without an entry there (held by a worker of an older version) is found by a scan of
    the unacked hash's tags, and only such copies are read."""
    queued = {slot_of(payload) for _, _, payload in _queued_of(client, run)}
    queued |= _taken_of(client, run)
    short = _index_short(client)
    suffix, held, cursor = f" {run}", set[int](), "0"
    page = client.register_script(_IN_FLIGHT_PAGE)
    while True:
        cursor, *values = page(keys=[IN_FLIGHT, KOMBU_UNACKED], args=[cursor, 1024])
        held |= {int(v[:-len(suffix)]) for raw in values if (v := text(raw)).endswith(suffix)}
        if text(cursor) == "0":
            break
    # Again after the scan, which dropped the entries whose copy is gone: they could have
    # hidden as many copies without an entry from the count before it.
    if short or _index_short(client):
        held |= {slot_of(payload) for _, payload in _unindexed_of(client, run)}
    return queued | held


def _taken_of(client: redis.Redis, run: str) -> set[int]:
    """Slots of `run` taken by a worker and not yet recorded as held (fleetgen/queue/broker.py
    `_TAKE`): a take's moment, or a take whose reply a cut network lost. Every holder with a
    taking list has a lease (the take gives it one); the lists are empty but for those."""
    holders = [text(h) for h in client.zrange(LEASES, 0, -1)]  # type: ignore[arg-type]
    pipe = client.pipeline(transaction=False)
    for holder in holders:
        pipe.lrange(taking_key(holder), 0, -1)
    slots: set[int] = set()
    for items in pipe.execute() if holders else []:
        for raw in items:
            payload = task_payload(orjson.loads(raw))
            if payload is not None and payload.get("run") == run:
                slots.add(slot_of(payload))
    return slots


def _index_short(client: redis.Redis) -> bool:
    """Fewer IN_FLIGHT entries than unacked copies, both counted in one MULTI: a take or an ack
    between two separate counts (each changes both at once) would look like a missing entry
    and cost a scan of every copy's tag."""
    pipe = client.pipeline(transaction=True)
    pipe.hlen(IN_FLIGHT)
    pipe.hlen(KOMBU_UNACKED)
    indexed, unacked = pipe.execute()
    return int(indexed) < int(unacked)


def _unindexed_of(client: redis.Redis, run: str) -> Iterator[tuple[Any, dict[str, Any]]]:
    """(delivery tag, payload) of each task of `run` held unacked without an IN_FLIGHT entry:
    the tags found a page at a time by a script, then only their copies read."""
    page = client.register_script(_UNINDEXED_PAGE)
    cursor = "0"
    while True:
        cursor, *tags = page(keys=[KOMBU_UNACKED, IN_FLIGHT], args=[cursor, SCAN_PAGE])
        copies = client.hmget(KOMBU_UNACKED, tags) if tags else []
        for tag, raw in zip(tags, copies, strict=True):
            payload = task_payload(orjson.loads(raw)[0]) if raw is not None else None
            if payload is not None and payload.get("run") == run:
                yield tag, payload
        if text(cursor) == "0":
            return


# A page of IN_FLIGHT's values whose message is still unacked, and the entries of any other
# tag removed (a copy removed by a path that left its entry, e.g. kombu's own `_restore`: it
# must never keep a lost row looking held). Valkey's work a page: ~1,024 HEXISTS, well under
# a millisecond, so no bystander waits for the whole scan.
_IN_FLIGHT_PAGE = """
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local out = {r[1]}
local kv = r[2]
for i = 1, #kv, 2 do
  if redis.call('HEXISTS', KEYS[2], kv[i]) == 1 then out[#out + 1] = kv[i + 1]
  else redis.call('HDEL', KEYS[1], kv[i]) end
end
return out
"""
# A page of the unacked hash's tags that have no IN_FLIGHT entry: the copies stay in Valkey
# (HSCAN's values are dropped inside the script), only the tags are replied.
_UNINDEXED_PAGE = """
local r = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local out = {r[1]}
local kv = r[2]
for i = 1, #kv, 2 do
  if redis.call('HEXISTS', KEYS[2], kv[i]) == 0 then out[#out + 1] = kv[i] end
end
return out
"""


# Messages read per reply when scanning the queue or the unacked hash: a task is ~13 KB (its
# token ids), and the queue is shared by every run, so one LRANGE 0 -1 of a deep queue is a
# reply of hundreds of megabytes that blocks Valkey while it is built. Pages keep each reply
# a few megabytes.
SCAN_PAGE = 256


def task_queues(client: redis.Redis) -> list[str]:
    """The shared queue and every worker's own (prefix affinity) that holds messages now."""
    own = sorted(text(key) for key in client.scan_iter(match=f"{AFFINITY_PREFIX}*", count=1000))
    return [QUEUE, *own]


def queued(client: redis.Redis) -> int:
    """Messages waiting in the shared queue and in every worker's own (all runs')."""
    queues = task_queues(client)
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
    return sum(int(n) for n in pipe.execute())


def _queued_of(client: redis.Redis, run: str,
               ) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """(queue, raw message, payload) of each task of `run` in the queues, a page at a time.
    Workers pop at the right end and producers push at the left, so a message is never skipped
    by the pages (a push shifts it to a later index: seen twice at worst, and callers keep sets
    or remove exact bytes); one popped meanwhile is in the unacked hash, scanned next. One
    moved from a worker's queue to the shared one meanwhile (`move_queue`) may be missed for a
    scan: the reconciliation acts only on a row missing at two scans in a row."""
    for queue in task_queues(client):
        start = 0
        while True:
            page = client.lrange(queue, start, start + SCAN_PAGE - 1)
            for raw in page:
                payload = task_payload(orjson.loads(raw))
                if payload is not None and payload.get("run") == run:
                    yield queue, raw, payload
            if len(page) < SCAN_PAGE:
                break
            start += SCAN_PAGE


def move_queue(client: redis.Redis, source: str) -> int:
    """Every message of a worker's own queue to the next-taken end of the shared queue, oldest
    first, one atomic LMOVE each (a message is in one list or the other, never both or
    neither); returns how many."""
    moved = 0
    while client.lmove(source, QUEUE, "RIGHT", "RIGHT") is not None:
        moved += 1
    return moved


def _unacked_of(client: redis.Redis, run: str) -> Iterator[tuple[Any, dict[str, Any]]]:
    """(delivery tag, payload) of each task of `run` a worker holds unacked, by HSCAN pages
    (a tag present for the whole scan is returned, maybe twice)."""
    for tag, raw in client.hscan_iter(KOMBU_UNACKED, count=SCAN_PAGE):
        payload = task_payload(orjson.loads(raw)[0])
        if payload is not None and payload.get("run") == run:
            yield tag, payload


def unrenewed_leases(client: redis.Redis, run: str, since: float) -> list[float]:
    """The lease times of `run`'s messages whose lease nobody has renewed since `since` (epoch
    s, Valkey's clock): each held by a worker that died or froze, or fetched by one that died
    before its next heartbeat. Bounded by what dead workers held."""
    # (member, score) pairs; redis-py types the reply as a plain list.
    stale: list[tuple[Any, float]] = list(
        client.zrangebyscore(KOMBU_UNACKED_INDEX, 0, since, withscores=True))  # type: ignore[arg-type]
    lapsed: list[tuple[bytes, float]] = list(
        client.zrangebyscore(LEASES, "-inf", since, withscores=True))  # type: ignore[arg-type]
    for holder, renewed in lapsed:
        tags: set[Any] = client.smembers(held_key(text(holder)))
        stale += [(tag, renewed) for tag in tags]
    if not stale:
        return []
    # Each tag's run from its IN_FLIGHT entry (~50 bytes), for a tag whose copy is still there;
    # the copy is read only where there is no entry (a worker of an older version).
    pipe = client.pipeline(transaction=False)
    pipe.hmget(IN_FLIGHT, [tag for tag, _ in stale])
    for tag, _ in stale:
        pipe.hexists(KOMBU_UNACKED, tag)
    indexed, *present = pipe.execute()
    entries = [entry if there else None for entry, there in zip(indexed, present, strict=True)]
    bare = [tag for (tag, _), entry in zip(stale, entries, strict=True) if entry is None]
    runs = {tag: _run_of(raw) for tag, raw in
            zip(bare, client.hmget(KOMBU_UNACKED, bare) if bare else [], strict=True)}
    suffix = f" {run}"
    return [float(score) for (tag, score), entry in zip(stale, entries, strict=True)
            if (text(entry).endswith(suffix) if entry is not None else runs[tag] == run)]


def _run_of(copy: Any) -> str | None:
    """The run of an unacked copy's task, or None if it is gone or not fleetgen's task."""
    payload = task_payload(orjson.loads(copy)[0]) if copy is not None else None
    return payload.get("run") if payload is not None else None


def requeue_unacked(client: redis.Redis) -> int:
    """Put every message kombu holds as unacked back at the front of its queue; returns how
    many. Only for a Redis no worker is connected to (the demo's own, before its workers
    start): each one is then a prompt a stopped worker held, which kombu would otherwise give
    back only after the visibility timeout (hours)."""
    requeued = 0
    # A dict: HSCAN may return a tag twice, and each must be requeued once.
    for tag, raw in dict(client.hscan_iter(KOMBU_UNACKED, count=SCAN_PAGE)).items():
        message, _exchange, routing_key = orjson.loads(raw)
        pipe = client.pipeline(transaction=True)
        pipe.rpush(routing_key or QUEUE, orjson.dumps(message))  # BRPOP takes the right end
        pipe.hdel(KOMBU_UNACKED, tag)
        pipe.zrem(KOMBU_UNACKED_INDEX, tag)
        pipe.hdel(IN_FLIGHT, tag)
        pipe.execute()
        requeued += 1
    return requeued


def remove_tasks(client: redis.Redis, run: str) -> tuple[int, int]:
    """Take every task of `run` out of the queue and out of kombu's unacked hash and index;
    returns (queued, unacked) removed. Each removal is of one exact message (LREM of its bytes,
    HDEL of its tag), so a message a worker pops meanwhile is simply not counted; a worker
    already running one drops its outcome when it finds the run's manifest gone
    (workers/sink.py)."""
    queued = 0
    for queue, raw, _ in list(_queued_of(client, run)):
        queued += int(client.lrem(queue, 1, raw))
    unacked = 0
    for tag, _ in list(_unacked_of(client, run)):
        pipe = client.pipeline(transaction=True)
        pipe.hdel(KOMBU_UNACKED, tag)
        pipe.zrem(KOMBU_UNACKED_INDEX, tag)
        pipe.hdel(IN_FLIGHT, tag)
        unacked += int(pipe.execute()[0])
    return queued, unacked
