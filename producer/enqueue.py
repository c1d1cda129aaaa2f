"""Enqueueing: Celery protocol-2 messages in pipelined batches, held under a high-water mark."""

from __future__ import annotations

import base64
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import orjson
import redis

from fleetgen.contract import KIND_REJECTED, QUEUE, TASK_NAME, RunKeys, TaskPayload, worker_key

log = logging.getLogger("fleetgen.producer")

# Below this the queue could run dry between two producer batches on a large fleet.
MIN_HIGH_WATER = 512


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
    argsrepr = (f"[{{'run': {payload['run']!r}, 'line': {payload['line']}, "
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


class Enqueuer:
    """Writes task messages straight into the queue's Redis list, a whole batch in one
    MULTI round trip together with the rows' `sent` bits, and rejections to the stream."""

    def __init__(self, client: redis.Redis, run: str, high_water: int | None = None) -> None:
        self.redis = client
        self.keys = RunKeys(run)
        self.fixed_high_water = high_water
        self._high_water_cache: tuple[float, int] = (0.0, MIN_HIGH_WATER)

    def send(self, payloads: list[TaskPayload]) -> None:
        """Enqueue in input order (LPUSH here, BRPOP in the worker: first in, first out).
        MULTI makes a batch atomic: a row is queued and marked sent, or neither."""
        if not payloads:
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(QUEUE, *[task_message(payload) for payload in payloads])
        set_bits(pipe, self.keys.sent, [payload["line"] for payload in payloads])
        pipe.execute()

    def reject(self, records: Iterable[dict[str, Any]]) -> None:
        """A rejection is an outcome: XADD it and mark the row done and sent, atomically."""
        pipe = self.redis.pipeline(transaction=True)
        count = 0
        for record in records:
            line = int(record["line"])
            pipe.xadd(self.keys.stream, {"k": KIND_REJECTED, "d": orjson.dumps(record)})
            pipe.setbit(self.keys.done, line, 1)
            pipe.setbit(self.keys.sent, line, 1)
            count += 1
        if count:
            pipe.hincrby(self.keys.stats, "rejected", count)
            pipe.execute()

    # -- backpressure ---------------------------------------------------------------------
    def queue_depth(self) -> int:
        return int(self.redis.llen(QUEUE))

    def high_water(self) -> int:
        """Twice the live fleet's total concurrency: enough that no worker waits on the
        producer, small enough that Redis holds minutes of work, not the whole data set."""
        if self.fixed_high_water is not None:
            return self.fixed_high_water
        checked_at, value = self._high_water_cache
        if time.monotonic() - checked_at < 5.0:
            return value
        value = max(MIN_HIGH_WATER, 2 * fleet_concurrency(self.redis))
        self._high_water_cache = (time.monotonic(), value)
        return value

    def wait_for_room(self, should_stop: Callable[[], bool] = lambda: False,
                      poll_s: float = 0.05) -> None:
        while self.queue_depth() >= self.high_water() and not should_stop():
            time.sleep(poll_s)


def set_bits(pipe: Any, key: str, offsets: list[int]) -> None:
    """Set many bits with one BITFIELD command: one reply instead of one per SETBIT, which
    was a quarter of the producer's time."""
    args: list[Any] = []
    for offset in offsets:
        args += ["SET", "u1", offset, 1]
    if args:
        pipe.execute_command("BITFIELD", key, *args)


def fleet_concurrency(client: redis.Redis) -> int:
    total = 0
    for key in client.scan_iter(match=worker_key("*"), count=1000):
        raw = client.hget(key, "concurrency")
        total += int(raw) if raw else 0
    return total
