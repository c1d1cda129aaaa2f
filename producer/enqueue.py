"""Enqueueing: Celery messages in pipelined batches, held under a high-water mark."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
import redis
from celery import Celery

from fleetgen.celeryconf import DEFAULT_VISIBILITY_TIMEOUT_S, make_app
from fleetgen.contract import KIND_REJECTED, QUEUE, TASK_NAME, RunKeys, TaskPayload, worker_key

log = logging.getLogger("fleetgen.producer")

# Below this the queue could run dry between two producer batches on a large fleet.
MIN_HIGH_WATER = 512


class Enqueuer:
    """Sends task messages through kombu's pipelined batch publish (one round trip per
    batch instead of one per prompt), and rejections straight to the run's stream."""

    def __init__(self, client: redis.Redis, redis_url: str, run: str,
                 high_water: int | None = None) -> None:
        self.redis = client
        self.keys = RunKeys(run)
        self.fixed_high_water = high_water
        self.app: Celery = make_app(redis_url, visibility_timeout_s=DEFAULT_VISIBILITY_TIMEOUT_S)
        self._high_water_cache: tuple[float, int] = (0.0, MIN_HIGH_WATER)

    def close(self) -> None:
        self.app.close()

    def send(self, payloads: list[TaskPayload]) -> None:
        if not payloads:
            return
        with self.app.producer_or_acquire() as producer, producer.batch(max_size=1000):
            for payload in payloads:
                self.app.send_task(TASK_NAME, args=[payload], queue=QUEUE, producer=producer)
        pipe = self.redis.pipeline(transaction=False)
        for payload in payloads:
            pipe.setbit(self.keys.sent, payload["line"], 1)
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


def fleet_concurrency(client: redis.Redis) -> int:
    total = 0
    for key in client.scan_iter(match=worker_key("*"), count=1000):
        raw = client.hget(key, "concurrency")
        total += int(raw) if raw else 0
    return total
