"""Enqueueing: Celery protocol-2 messages in pipelined batches, held under a high-water mark."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import redis

from fleetgen.queue.contract import (
    KIND_HOLDOUT,
    KIND_REJECTED,
    KIND_RESULT,
    QUEUE,
    TaskPayload,
    slot_of,
    slots_of,
    worker_key,
)
from fleetgen.queue.wire import queued, task_message
from fleetgen.records.outcomes import result_counts, stream_entry
from fleetgen.runstate.keys import run_keys

log = logging.getLogger("fleetgen.producer")

# Below this the queue could run dry between two producer batches on a large fleet.
MIN_HIGH_WATER = 512


class Enqueuer:
    """Writes task messages straight into the queue's Redis list, a whole batch in one
    MULTI round trip together with the rows' `sent` bits, and rejections to the stream."""

    def __init__(self, client: redis.Redis, run: str, high_water: int | None = None) -> None:
        self.redis = client
        self.keys = run_keys(run)
        self.fixed_high_water = high_water
        self._high_water_cache: tuple[float, int] = (0.0, MIN_HIGH_WATER)

    def send(self, payloads: list[TaskPayload],
             routes: dict[str, list[TaskPayload]] | None = None) -> None:
        """Enqueue in input order (LPUSH here, BRPOP in the worker: first in, first out), in
        the shared queue or where `routes` puts them (a worker's own: producer/affinity.py).
        MULTI makes a batch atomic: a row is queued and marked sent, or neither."""
        if not payloads:
            return
        pipe = self.redis.pipeline(transaction=True)
        for queue, group in (routes or {QUEUE: payloads}).items():
            pipe.lpush(queue, *[task_message(payload) for payload in group])
        set_bits(pipe, self.keys.sent, [slot_of(payload) for payload in payloads])
        pipe.execute()

    def send_next(self, payloads: list[TaskPayload], routes: dict[str, list[TaskPayload]],
                  ) -> None:
        """Next turns, next to be taken (RPUSH) in the queues `routes` gives them (the shared
        one, or a worker's own: producer/affinity.py); atomic with their `sent` bits."""
        if not payloads:
            return
        pipe = self.redis.pipeline(transaction=True)
        for queue, group in routes.items():
            pipe.rpush(queue, *[task_message(payload) for payload in group])
        set_bits(pipe, self.keys.sent, [slot_of(payload) for payload in payloads])
        pipe.execute()

    def reject(self, records: Iterable[dict[str, Any]]) -> None:
        """A rejection is an outcome: XADD it and mark the row done and sent, atomically."""
        pipe = self.redis.pipeline(transaction=True)
        count = 0
        for record in records:
            slot = slot_of(record)
            pipe.xadd(self.keys.stream, stream_entry(KIND_REJECTED, record))
            pipe.setbit(self.keys.done, slot, 1)
            pipe.setbit(self.keys.sent, slot, 1)
            count += 1
        if count:
            pipe.hincrby(self.keys.stats, "rejected", count)
            pipe.execute()

    def hold_out(self, records: Iterable[dict[str, Any]]) -> None:
        """A held-out row is an outcome too, never sent: XADD its line and mark every request
        it stands for done and sent, atomically (a resume skips them; Redis losing the bits
        sends the line again, and the drainer keeps the first)."""
        pipe = self.redis.pipeline(transaction=True)
        count = 0
        for record in records:
            slots = list(slots_of(record))
            pipe.xadd(self.keys.stream, stream_entry(KIND_HOLDOUT, record))
            set_bits(pipe, self.keys.done, slots)
            set_bits(pipe, self.keys.sent, slots)
            count += len(slots)
        if count:
            pipe.hincrby(self.keys.stats, "holdout", count)
            pipe.execute()

    def reuse(self, records: list[dict[str, Any]]) -> None:
        """Earlier answers, this run's results: XADD each and mark its request done and sent,
        atomically, counted as a worker counts its answers (plus `reused`): a resume skips
        them; Redis losing the bits reuses the answer again, and the drainer keeps the first."""
        if not records:
            return
        pipe = self.redis.pipeline(transaction=True)
        counts: Counter[str] = Counter(reused=len(records))
        for record in records:
            pipe.xadd(self.keys.stream, stream_entry(KIND_RESULT, record))
            counts.update(result_counts(record))
        slots = [slot_of(record) for record in records]
        set_bits(pipe, self.keys.done, slots)
        set_bits(pipe, self.keys.sent, slots)
        for name, value in counts.items():
            if value:
                pipe.hincrby(self.keys.stats, name, value)
        pipe.execute()

    # -- backpressure ---------------------------------------------------------------------
    def queue_depth(self) -> int:
        """What waits to be taken: the shared queue and every worker's own (prefix affinity
        sends first turns there too, so the mark holds over all of them)."""
        return queued(self.redis)

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

    def full(self) -> bool:
        """The queues hold the high-water mark: the next batch waits (producer/loop.py)."""
        return self.queue_depth() >= self.high_water()


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
