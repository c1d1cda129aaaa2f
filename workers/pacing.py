"""How many prompts a worker holds against its engine at once (its in-flight limit), where the
limit comes from, and, where the engine reports no slot count (vLLM), the pacer that finds it
from the engine's own queue.

Why from the queue: a server that runs K requests at once and has more waiting is saturated;
one with nothing waiting may have free slots. So the pacer doubles its limit while the server's
waiting queue is empty and the limit is in use, and, once requests wait, cuts back to what runs
plus a small queue (max(2, running / 16)), so that a finished request's slot is refilled at the
server's next step without a round trip. Once the server has queued, the most it ran then is
taken for its slots: the limit doubles back up to them plus the queue, and creeps (by the
queue's size) beyond (TCP's slow start and congestion avoidance). Each worker cuts only its
share of the excess (its in-flight over all the server holds), so W workers on one engine
(`--workers-per-engine`, or W hosts behind one router) together hold the server's slots plus
the queue without knowing W; growth stops as soon as any of them sees a queue. The host's
cores play no part.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from fleetgen.engine.load import Load, LoadReader

log = logging.getLogger("fleetgen.worker")

# How often the pacer reads the engine's queue: a few steps of a GPU's scheduler, so that the
# limit reaches a server's hundreds of slots within seconds of the first prompt.
PACE_EVERY_S = 0.5
# A paced worker's first limit, then doubled per reading: what any GPU server runs at once
# (vLLM's smallest default --max-num-seqs is 128, on CPU), so the first second is not a ramp;
# a server with fewer slots cuts it at the first reading.
START_LIMIT = 64
# The queue held in the server once it is full: its running requests over this, at least 2.
QUEUE_SHARE = 16
MIN_QUEUE = 2


def held_queue(running: int) -> int:
    """The requests to keep waiting in a full server."""
    return max(MIN_QUEUE, running // QUEUE_SHARE)


class Pacer:
    """The pure controller: `observe` one reading of the server's load and of this worker's
    in-flight count, get the next limit."""

    def __init__(self, start: int, ceiling: int) -> None:
        self.ceiling = max(1, ceiling)
        self.limit = min(max(1, start), self.ceiling)
        # The most the server ran while requests waited: its slots, as far as seen (0: it has
        # not queued yet). Below them plus the queue the limit doubles; above, it creeps.
        self.slots_seen = 0

    def observe(self, load: Load, in_flight: int) -> int:
        queue = held_queue(load.running)
        if load.waiting > queue:
            self.slots_seen = max(self.slots_seen, load.running)
            # This worker's share of the excess, cut from what it holds now: the same reading
            # again (before any answer came back) gives the same limit, not a second cut.
            share = min(1.0, in_flight / max(1, load.running + load.waiting))
            cut = math.ceil((load.waiting - queue) * share)
            self.limit = max(1, min(self.limit, in_flight - cut))
        elif load.waiting == 0 and in_flight >= self.limit - max(1, self.limit // 8):
            self.limit = min(self.ceiling, self._grown(queue))
        return self.limit

    def _grown(self, queue: int) -> int:
        known = self.slots_seen + queue
        if self.limit < known:  # back up to what the server is known to take, at once
            return min(known, 2 * self.limit)
        return self.limit + (queue if self.slots_seen else self.limit)


@dataclass(frozen=True)
class Pace:
    """The limit in force, in the words the heartbeat carries to `run` and `status`."""

    limit: int
    source: str  # where the limit comes from, one line
    paced: bool  # found from the server's queue, and changing with it
    load: Load | None = None  # the server's last reading, where it can be read
    slots: int | None = None  # the running requests the server reports, where it does


def beat_fields(pace: Pace | None, pool: int) -> dict[str, int | str]:
    """What the heartbeat says of the limit: `concurrency` is the limit in force (what the
    producer's high-water mark and `status` count), `limit_from` its source; the engine's
    queue where it was read (-1: not read)."""
    if pace is None:  # -c given before the engine answered: Celery's pool is the limit
        return {"concurrency": pool, "limit_from": f"-c {pool}, as given", "paced": 0,
                "limit_max": pool, "engine_running": -1, "engine_waiting": -1,
                "engine_slots": -1}
    load = pace.load
    return {"concurrency": pace.limit, "limit_from": pace.source, "paced": int(pace.paced),
            "limit_max": pool,
            "engine_running": -1 if load is None else load.running,
            "engine_waiting": -1 if load is None else load.waiting,
            "engine_slots": pace.slots or -1}


@dataclass(frozen=True)
class LimitPlan:
    """What start-up decided: the pool's size, the first limit, and how it moves."""

    pool: int  # threads: the most the limit can ever be
    limit: int
    source: str
    paced: bool = False
    slots: int | None = None  # the running requests the server reports, where it does


class InFlightLimit:
    """The limit of one worker process: fixed, or paced by a daemon thread that reads the
    engine's queue every PACE_EVERY_S. Readers (the consumer loop's step, the heartbeat) take
    `current` and never wait on the network."""

    def __init__(self, plan: LimitPlan, reader: LoadReader | None,
                 in_flight: Callable[[], int], interval_s: float = PACE_EVERY_S) -> None:
        self.plan = plan
        self._reader = reader
        self._in_flight = in_flight
        self._interval_s = interval_s
        self._pacer = Pacer(plan.limit, plan.pool) if plan.paced else None
        self.current = Pace(plan.limit, plan.source, plan.paced, slots=plan.slots)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> Pace:
        """One reading and, when paced, the next limit."""
        load = self._reader.read() if self._reader is not None else None
        limit = self.current.limit
        if self._pacer is not None and load is not None:
            limit = self._pacer.observe(load, self._in_flight())
            if limit != self.current.limit:
                log.debug("in-flight limit %d -> %d (%d running, %d waiting)",
                          self.current.limit, limit, load.running, load.waiting)
        self.current = Pace(limit, self.plan.source, self.plan.paced, load, self.plan.slots)
        return self.current

    def start(self) -> None:
        if self._reader is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="fleetgen-pacing", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._reader is not None:
            self._reader.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.tick()
            except Exception:  # a reading bug must not freeze the limit silently
                log.warning("pacing: reading the engine's queue failed", exc_info=True)
