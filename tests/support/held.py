"""What a worker holds, read from Redis: proof that a fault landed while work was in flight.

kombu keeps every delivered, not yet acknowledged message in its `unacked` hash (late acks),
so the lines in it are the prompts the workers hold.
"""

from __future__ import annotations

import re
import socket
from typing import Any

import orjson
import redis

from fleetgen.queue.contract import QUEUE, worker_key
from fleetgen.queue.redisconn import read_hash
from fleetgen.queue.wire import KOMBU_UNACKED, task_payload
from fleetgen.runstate.bitmap import Bits
from fleetgen.runstate.keys import RunKeys


def worker_name(gpu: int) -> str:
    return f"gpu{gpu}@{socket.gethostname()}"


def _lines(messages: list[Any], run: str) -> set[int]:
    lines: set[int] = set()
    for message in messages:
        payload = task_payload(message)
        if payload is not None and payload.get("run") == run:
            lines.add(int(payload["line"]))
    return lines


def unacked_tasks(client: redis.Redis, run: str) -> dict[str, int]:
    """Celery task id -> line, for the messages of `run` now unacked."""
    tasks: dict[str, int] = {}
    for raw in client.hvals(KOMBU_UNACKED):
        message = orjson.loads(raw)[0]
        payload = task_payload(message)
        if payload is not None and payload.get("run") == run:
            tasks[message["headers"]["id"]] = int(payload["line"])
    return tasks


# What Celery logs (at WARNING) for a task the worker hands back (workers/celery.py: Reject).
REJECTED = re.compile(r"Task \S+\[([0-9a-f-]+)\] reject requeue=True")


def handed_back(worker_log: str, tasks: dict[str, int]) -> set[int]:
    """Lines among `tasks` that the worker whose log this is rejected back to the queue."""
    return {tasks[task] for task in REJECTED.findall(worker_log) if task in tasks}


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
