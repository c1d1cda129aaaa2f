"""Prefix affinity: the next turn of a conversation goes to the worker that answered the turn
before, whose server's prefix cache holds the whole history (SGLang's radix cache keeps a
finished request's prompt and output, `cache_finished_req`); its in-server longest-prefix
scheduling turns itself off past 128 waiting requests (`schedule_policy.py`
`_determine_active_policy`), so at a fleet's queue depths the client has to send it there.

A worker consumes its own queue beside the shared one (workers/gate.py), and kombu's
round-robin BRPOP takes from each in turn, so a next turn waits for at most about one free
slot of its worker. No GPU idles for it: a next turn goes to the shared queue when its worker
is not alive and taking prompts, or already has a pool's worth waiting in its queue; and a
worker's queue is moved to the shared one once that worker is lost or stops taking prompts."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import redis

from fleetgen.base.contract import QUEUE, TaskPayload, slot_of, worker_key, worker_queue
from fleetgen.base.heartbeat import Heartbeat
from fleetgen.base.redisconn import read_hash
from fleetgen.base.wire import move_queue, task_queues

# A next turn waits this long at most in its worker's queue before any worker may take it.
WAIT_S = 2.0

# Move one exact message from a worker's queue to the next-taken end of the shared queue, only
# if it is still there (a worker may have taken it meanwhile): atomic, so it is in one list.
_STEAL = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"""


class Affinity:
    def __init__(self, client: redis.Redis, *, enabled: bool = True,
                 wait_s: float = WAIT_S) -> None:
        self.redis = client
        self.enabled = enabled
        self.wait_s = wait_s
        self._swept_at = 0.0
        self._seen: dict[str, set[Any]] = {}  # per worker queue, what the last sweep saw
        self._steal = client.register_script(_STEAL)

    def routes(self, payloads: list[TaskPayload],
               answered_by: Mapping[int, str | None]) -> dict[str, list[TaskPayload]]:
        """Queue -> the payloads to send there: by `answered_by` (slot -> the worker that
        answered the turn before), within what each worker can take soon."""
        routes: dict[str, list[TaskPayload]] = {}
        room: dict[str, int] = {}
        for payload in payloads:
            worker = answered_by.get(slot_of(payload)) if self.enabled else None
            queue = QUEUE
            if worker is not None:
                if worker not in room:
                    room[worker] = self._room(worker)
                if room[worker] > 0:
                    room[worker] -= 1
                    queue = worker_queue(worker)
            routes.setdefault(queue, []).append(payload)
        return routes

    def _room(self, worker: str) -> int:
        """How many more next turns the worker's queue may hold: its pool size, less what
        waits there; 0 for a worker that is not alive and taking prompts."""
        beat = read_hash(self.redis, worker_key(worker))
        if not taking(beat):
            return 0
        return int(beat.get("concurrency") or 0) - int(self.redis.llen(worker_queue(worker)))

    def sweep(self) -> int:
        """At most every `wait_s`: move the queue of each worker that is lost, gone or not
        taking prompts to the shared queue, and from a live worker's queue each message the
        last sweep saw there already (it waited `wait_s` or more: its worker is saturated,
        any other may take it). Returns the messages moved."""
        now = time.monotonic()
        if now - self._swept_at < self.wait_s:
            return 0
        self._swept_at = now
        moved, seen = 0, dict[str, set[Any]]()
        for queue in task_queues(self.redis)[1:]:
            worker = queue[len(worker_queue("")):]
            if not taking(read_hash(self.redis, worker_key(worker))):
                moved += move_queue(self.redis, queue)
                continue
            waiting = set(self.redis.lrange(queue, 0, -1))
            for raw in waiting & self._seen.get(queue, set()):
                moved += int(self._steal(keys=[queue, QUEUE], args=[raw]))
            seen[queue] = waiting
        self._seen = seen
        return moved


def taking(beat: Mapping[str, str]) -> bool:
    """A heartbeat of a worker alive now whose gate is open (its engine up)."""
    if not beat:
        return False
    return beat.get("consuming") == "1" and not Heartbeat.of(beat).lost(time.time())


