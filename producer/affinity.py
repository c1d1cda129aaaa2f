"""Prefix affinity: the next turn of a conversation goes to the worker that answered the turn
before, whose server's prefix cache holds the whole history (SGLang's radix cache keeps a
finished request's prompt and output, `cache_finished_req`); its in-server longest-prefix
scheduling turns itself off past 128 waiting requests (`schedule_policy.py`
`_determine_active_policy`), so at a fleet's queue depths the client has to send it there.

A worker consumes its own queue beside the shared one (workers/gate.py) and takes it first
(fleetgen/queue/broker.py `OwnQueueFirst`), so a next turn waits for one free slot of its
worker. No GPU idles for it: a next turn goes to the shared queue when its worker is not
alive and taking prompts, or already has NEXT_POOLS pools waiting in its queue; a worker's
queue is moved to the shared one once that worker is lost or stops taking prompts, and what
waits there goes to the shared queue while that is empty (`sweep`, run by the producer at
every batch, every look while the queues are full, and every look while it waits: the run
object's look, producer/loop.py).

First turns that share a prefix with others (the samples of a prompt, prompts that open with
the same long system prompt or document) go to one worker too: the one a rendezvous hash of
their first PREFIX_BLOCK tokens picks among the workers taking prompts, so every request with
that prefix meets the server that computed it, without the producer remembering anything."""

from __future__ import annotations

import hashlib
import time
from array import array
from collections.abc import Mapping
from typing import Any

import redis

from fleetgen.queue.contract import QUEUE, TaskPayload, slot_of, worker_key, worker_queue
from fleetgen.queue.heartbeat import Heartbeat
from fleetgen.queue.redisconn import read_hash
from fleetgen.queue.serverclock import ServerClock
from fleetgen.queue.wire import move_queue, task_queues

# A next turn waits this long at most in its worker's queue before any worker may take it.
WAIT_S = 2.0
# First turns are routed by their first this many tokens: a prefix this long is worth a
# server's compute (a long system prompt, a document, the prompt of several samples), and two
# prompts sharing it share at least a system prompt's worth. Shorter prompts with one sample
# go to the shared queue: their prefill is cheap, and balancing is worth more.
PREFIX_BLOCK = 256
# What a worker's queue may hold, in pools (its concurrency): first turns up to FIRST_POOLS
# (all workers' together, the producer's high-water mark of twice the fleet's concurrency),
# next turns up to NEXT_POOLS, so they always find room above the first turns.
FIRST_POOLS = 2
NEXT_POOLS = 3

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
                 wait_s: float = WAIT_S, route_first: bool = False) -> None:
        self.redis = client
        self.enabled = enabled
        # First turns go to workers' own queues only when this producer stays to sweep them
        # (it waits for the run): a queue of a stopped, frozen or saturated worker is moved
        # to the shared queue by the waiting producer alone (`sweep`), and a producer that
        # has left would strand what waits there. Given once, by the run's Plan (run.py).
        self.route_first = route_first
        self.wait_s = wait_s
        self._swept_at = 0.0
        self._seen: dict[str, set[Any]] = {}  # per worker queue, what the last sweep saw
        self._steal = client.register_script(_STEAL)
        self._workers_at: tuple[float, dict[str, int]] = (-1.0, {})
        self._clock = ServerClock(client)  # the heartbeats' clock

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

    def first_routes(self, payloads: list[TaskPayload]) -> dict[str, list[TaskPayload]]:
        """Queue -> the first turns to send there: each one with a prefix key (prefix_key) to
        the first worker in its key's rendezvous order whose queue holds less than two pools
        (bounded-load consistent hashing; two pools each are the producer's whole high-water
        mark, so keyed work waits in the shared queue only when every worker has its share;
        next turns, whose whole history is cached there, may fill a queue to three, and go
        first), a key's payloads of one batch all to the same queue; to the shared queue
        when no worker has room, or without a key."""
        if not (self.enabled and self.route_first):
            return {QUEUE: payloads} if payloads else {}
        workers = self._workers()
        routes: dict[str, list[TaskPayload]] = {}
        chosen: dict[str, str] = {}
        waiting: dict[str, int] = {}
        for payload in payloads:
            key = prefix_key(payload)
            queue = QUEUE
            if key is not None and workers:
                if key not in chosen:
                    chosen[key] = self._first_with_room(key, workers, waiting)
                queue = chosen[key]
                if queue != QUEUE:
                    waiting[queue] += 1
            routes.setdefault(queue, []).append(payload)
        return routes

    def _first_with_room(self, key: str, workers: Mapping[str, int],
                         waiting: dict[str, int]) -> str:
        """The queue of the first worker in the key's rendezvous order that holds less than
        FIRST_POOLS pools (`waiting`: what each queue holds, read once a batch); else the
        shared one."""
        for worker in rendezvous_order(key, workers):
            queue = worker_queue(worker)
            if queue not in waiting:
                waiting[queue] = int(self.redis.llen(queue))
            if waiting[queue] < FIRST_POOLS * workers[worker]:
                return queue
        return QUEUE

    def _workers(self) -> dict[str, int]:
        """Worker -> its pool size, of the workers taking prompts now; looked up at most once
        a second (a producer batch each look would be a scan of the heartbeats each)."""
        now = time.monotonic()
        if now - self._workers_at[0] >= 1.0:
            workers: dict[str, int] = {}
            for key in self.redis.scan_iter(match=worker_key("*"), count=1000):
                name = key.decode() if isinstance(key, bytes) else str(key)
                beat = read_hash(self.redis, name)
                if taking(beat, self._clock.now()):
                    workers[name[len(worker_key("")):]] = int(beat.get("concurrency") or 0)
            self._workers_at = (now, workers)
        return self._workers_at[1]

    def _room(self, worker: str) -> int:
        """How many more next turns the worker's queue may hold: NEXT_POOLS pools, less what
        waits there (first turns fill it to FIRST_POOLS at most, so a next turn always finds
        room while its worker keeps up); 0 for a worker that is not alive and taking
        prompts."""
        beat = read_hash(self.redis, worker_key(worker))
        if not taking(beat, self._clock.now()):
            return 0
        return NEXT_POOLS * int(beat.get("concurrency") or 0) - int(
            self.redis.llen(worker_queue(worker)))

    def sweep(self) -> int:
        """At most every `wait_s`: move the queue of each worker that is lost, gone or not
        taking prompts to the shared queue; and, while the shared queue is empty (a worker
        that frees a slot finds nothing else to do), from a live worker's queue each message
        the last sweep saw there already (it waited `wait_s` or more: its worker is
        saturated, an idle one takes it). While the shared queue holds work, no GPU idles for
        a message that waits for its own worker, which takes its queue first
        (fleetgen/queue/broker.py `OwnQueueFirst`). Returns the messages moved."""
        now = time.monotonic()
        if now - self._swept_at < self.wait_s:
            return 0
        self._swept_at = now
        moved, seen = 0, dict[str, set[Any]]()
        for queue in task_queues(self.redis)[1:]:
            worker = queue[len(worker_queue("")):]
            if not taking(read_hash(self.redis, worker_key(worker)), self._clock.now()):
                moved += move_queue(self.redis, queue)
                continue
            waiting = set(self.redis.lrange(queue, 0, -1))
            if not self.redis.llen(QUEUE):
                for raw in waiting & self._seen.get(queue, set()):
                    moved += int(self._steal(keys=[queue, QUEUE], args=[raw]))
            seen[queue] = waiting
        self._seen = seen
        return moved


def taking(beat: Mapping[str, str], now: float) -> bool:
    """A heartbeat of a worker alive at `now` (Valkey's clock, the beat's) whose gate is open
    (its engine up)."""
    if not beat:
        return False
    return beat.get("consuming") == "1" and not Heartbeat.of(beat).lost(now)




def prefix_key(payload: TaskPayload) -> str | None:
    """What a first turn shares with others, as a key: its first PREFIX_BLOCK tokens (a shared
    system prompt or document, and a long prompt's samples, which share all of it); a short
    prompt's samples share their row; None for a short prompt's only sample."""
    ids = payload["input_ids"]
    if len(ids) >= PREFIX_BLOCK:
        block = array("q", ids[:PREFIX_BLOCK]).tobytes()
        return hashlib.blake2b(block, digest_size=8).hexdigest()
    if "sample" in payload:
        return f"line {payload['line']}"
    return None


def rendezvous_order(key: str, workers: Mapping[str, int]) -> list[str]:
    """The workers in the order a key tries them: highest random weight (rendezvous) hashing,
    so a key keeps its first worker while the fleet does, and a worker that leaves moves only
    the keys it was first for."""
    def weight(worker: str) -> bytes:
        return hashlib.blake2b(f"{key}\0{worker}".encode(), digest_size=8).digest()

    return sorted(workers, key=weight, reverse=True)
