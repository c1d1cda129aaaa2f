"""What a worker holds, read from Redis: proof that a fault landed while work was in flight.

kombu keeps every delivered, not yet acknowledged message in its `unacked` hash (late acks),
so the lines in it are the prompts the workers hold; a line that leaves `unacked` for the
queue was handed back (rejected with requeue, restored after the visibility timeout, or
requeued by a worker's shutdown).
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import orjson
import redis

from fleetgen.base.contract import QUEUE, RunKeys, worker_key
from fleetgen.base.redisconn import read_hash
from fleetgen.base.wire import KOMBU_UNACKED, task_payload
from producer.reconcile import Bits


def worker_name(gpu: int) -> str:
    return f"gpu{gpu}@{socket.gethostname()}"


def _lines(messages: list[Any], run: str) -> set[int]:
    lines: set[int] = set()
    for message in messages:
        payload = task_payload(message)
        if payload is not None and payload.get("run") == run:
            lines.add(int(payload["line"]))
    return lines


def unacked_lines(client: redis.Redis, run: str) -> set[int]:
    """Lines of `run` delivered to some worker and not acknowledged yet."""
    return _lines([orjson.loads(raw)[0] for raw in client.hvals(KOMBU_UNACKED)], run)


def queued_lines(client: redis.Redis, run: str) -> set[int]:
    return _lines([orjson.loads(raw) for raw in client.lrange(QUEUE, 0, -1)], run)


def done_lines(client: redis.Redis, run: str, total: int) -> set[int]:
    """Lines with an outcome (the workers' `done` bitmap)."""
    bits = Bits(client.get(RunKeys(run).done))
    return {line for line in range(1, total + 1) if line in bits}


def done_count(client: redis.Redis, run: str) -> int:
    return int(client.bitcount(RunKeys(run).done))


def worker_done(client: redis.Redis, run: str, worker: str) -> int:
    """Results a worker has put in the run's stream (its own counter in the run's stats)."""
    return int(read_hash(client, RunKeys(run).stats).get(f"{worker}|done", 0))


def heartbeat(client: redis.Redis, worker: str) -> dict[str, str]:
    return read_hash(client, worker_key(worker))


class QueueWatch:
    """Records every line of `run` seen in the queue while it runs: started after a fault,
    the lines it sees that were held before the fault are the ones handed back."""

    def __init__(self, client: redis.Redis, run: str, poll_s: float = 0.02) -> None:
        self.client = client
        self.run = run
        self.poll_s = poll_s
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> QueueWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.seen |= queued_lines(self.client, self.run)
            self._stop.wait(self.poll_s)
