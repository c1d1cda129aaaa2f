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

Why also from the token rate: a server can admit more than it runs well. vLLM on CPU takes its
128 sequences at once and queues nothing, yet generates no more tokens a second for them
(bench real's server: 77-88 tokens/s at any count from 8 to 128, bench real_rates), so more in
flight only lengthens each answer and the run's last ones with it. So while the
server has never queued, a step up is kept only if the server's own counter of generated
tokens (vllm:generation_tokens_total, ...) rose with it by MIN_GAIN. The first steps double the
limit (slow start: kept doubling while a doubling gives at least half of itself, as on a GPU
below its KV cache, 16 to 512 in five windows); the first that gives less ends the doubling,
and steps are a quarter from there. A step that did not pay goes back to the last one that
did; then, on a server that has never shown its slots (it admits all it is sent), the limit
probes down by a quarter and keeps each step down that loses at most MAX_LOSS of the best rate
seen in the run: the same tokens a second with fewer in flight is the same throughput at a
shorter latency, worth at most one answer's time at the run's end, so a step down that loses
more than noise is not worth it. The first step down that loses more goes back and holds there
for REPROBE_S, then a quarter up is tried again (the prompts' mix changes over a run); each
hold that follows a probe which found nothing doubles, up to MAX_HOLD_S.

Why it starts low (START_LIMIT): a step up cannot be taken back (its requests run to their end,
a whole answer's time: 35-70 s on that CPU server, minutes for long answers on a GPU), while a
limit too low costs only the steps until the next judgment. Started at 64, far above what the
CPU server needs, each step down waited for a cohort of answers to end (bench real: 1.075x
the best plain client); from 16 it is at that server's rate at once, and a GPU's doublings reach
its hundreds within seconds. A step down counts only once this worker holds no more than its
new limit: the requests sent before run to their end first. Beyond the slots a server has
shown, steps are the held queue's size and judged the same way, never down (below its slots
plus the queue a full server idles). Each rate is measured over a window of RATE_STEPS of the
server's steps (RATE_STEPS x running tokens, at least RATE_WINDOW_S) that opens once nothing
waits in the server (the new requests are all admitted), the limit is in use and SETTLE_STEPS
steps have passed, so that their prefill is behind it. Where a kind counts no tokens, growth
is as before.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetgen.engine.load import Load, LoadReader

log = logging.getLogger("fleetgen.worker")

# How often the pacer reads the engine's queue: a few steps of a GPU's scheduler, so that the
# limit reaches a server's hundreds of slots within seconds of the first prompt.
PACE_EVERY_S = 0.5
# A paced worker's first limit, from which it climbs (the module's doc: start low, since a
# step up cannot be taken back and a climb costs a few of the server's steps).
START_LIMIT = 16
# The queue held in the server once it is full: its running requests over this, at least 2.
QUEUE_SHARE = 16
MIN_QUEUE = 2
# Growth judged by the token rate (the module's doc): each step a quarter more in flight, kept
# when the rate rose by a quarter of what a step could give at most (25 % / 4).
PROBE_GROWTH = 1.25
MIN_GAIN = 0.06
# A step down is kept if it loses at most this share of the best rate seen at the limits kept
# (the best, not the last: steps down never add their losses up).
MAX_LOSS = 0.01
# The lowest a probe down goes: a server taking 8 at once is one the queue would have shown.
DOWN_FLOOR = 8
SETTLE_STEPS = 2
RATE_STEPS = 16
RATE_WINDOW_S = 2.0
REPROBE_S = 60.0
MAX_HOLD_S = 960.0


def held_queue(running: int) -> int:
    """The requests to keep waiting in a full server."""
    return max(MIN_QUEUE, running // QUEUE_SHARE)


@dataclass(frozen=True)
class _Window:
    """A measurement of the server's token rate at one limit, from `since` on."""

    limit: int
    since: float
    generated: float
    settled: bool  # the SETTLE_STEPS are behind it: `since` is where the rate counts from


class RateGate:
    """Decides growth where nothing waits in the server, from its generated-tokens counter:
    measure the rate at the limit in force, step up (by PROBE_GROWTH; by the held queue beyond
    the slots seen), measure again, keep the step if the rate rose by MIN_GAIN; else go back
    and, down to `floor`, step down while the rate stays within MAX_LOSS of the best; hold for
    REPROBE_S at the last limit kept."""

    def __init__(self) -> None:
        self._window: _Window | None = None
        self._kept: tuple[int, float] | None = None  # the last limit kept, the best tokens/s
        self._down = False  # probing down: the limit in force is a step below the kept one
        self._held_since: float | None = None
        self._hold_s = REPROBE_S  # doubled by each probe that finds nothing (the module's doc)
        self._reprobing = False  # measuring again after a hold
        self._gained = False  # a step up paid since the last hold
        # Slow start: each step up doubles the limit while a doubling pays at least half of
        # itself (a GPU below its KV cache: 16 to 512 in five windows); the first that pays
        # less ends it, and the limit moves by quarters from there.
        self._doubling = True
        # The best tokens/s seen at any limit kept, over the whole run (never below the kept
        # one's: `_keep` sets both): each step down is judged against it, so that the
        # reprobes, each measuring afresh from the limit in force, cannot walk the limit down
        # MAX_LOSS at a time.
        self._peak = 0.0
        self.note = ""  # the last decision, in words (the heartbeat carries it)

    def forget(self) -> None:
        """The limit was not in use (or was cut): a window open now would measure the supply
        of prompts, not the server."""
        self._window = None

    def unsettle(self) -> None:
        """Requests wait in the server (it is still admitting the ones just sent): a window
        not yet settled would open on their prefill, not on the limit's steady rate (bench
        real's first window at 64 read low and let a step up to 80 pass as a gain)."""
        if self._window is not None and not self._window.settled:
            self._window = None

    def holding(self, now: float) -> bool:
        """Held at a limit found by the rate, for the hold in force from the decision."""
        return self._held_since is not None and now - self._held_since < self._hold_s

    def next_limit(self, limit: int, load: Load, now: float, step: int, *, in_flight: int,
                   floor: int) -> int:
        """The limit after this reading; `step` up, `floor` the lowest a probe down goes
        (the limit itself: never down)."""
        assert load.generated is not None
        if self._held_since is not None:
            if self.holding(now):
                return limit
            self._held_since, self._kept = None, None  # measure afresh, then try a step
            self._reprobing, self._gained = True, False
        window = self._window
        # A counter below the window's start: the engine restarted (fleetgen restarts the
        # engines it launched) and counts from 0; a window across that would never close.
        if window is None or window.limit != limit or load.generated < window.generated:
            self._window = _Window(limit, now, load.generated, settled=False)
            return limit
        steps = max(1, load.running)
        tokens = load.generated - window.generated
        if not window.settled:
            # After a step down, what was sent before runs to its end: the server runs the
            # new limit only once this worker holds no more than it.
            if tokens >= SETTLE_STEPS * steps and in_flight <= limit:
                self._window = _Window(limit, now, load.generated, settled=True)
            return limit
        if now - window.since < RATE_WINDOW_S or tokens < RATE_STEPS * steps:
            return limit
        rate = tokens / (now - window.since)
        self._window = None
        if self._down:
            return self._judge_down(limit, rate, now, floor)
        return self._judge_up(limit, rate, now, step, floor)

    def _judge_up(self, limit: int, rate: float, now: float, step: int, floor: int) -> int:
        kept = self._kept
        if kept is None:
            self._keep(limit, rate)
            return 2 * limit if self._doubling else limit + step
        if rate >= kept[1] * (1 + MIN_GAIN):
            self._gained = True
            self.note = (f"{kept[0]} -> {limit} in flight raised its tokens/s "
                         f"{kept[1]:.0f} -> {rate:.0f}")
            self._keep(limit, rate)
            # A doubling keeps doubling while it gives at least half its size in tokens/s.
            self._doubling = self._doubling and rate >= kept[1] * (1 + limit / kept[0]) / 2
            return 2 * limit if self._doubling else limit + step
        self._doubling = False
        self.note = (f"held at {kept[0]}: {limit} in flight gave {rate:.0f} tokens/s against "
                     f"{kept[1]:.0f}, less than {MIN_GAIN:.0%} more")
        return self._step_down(kept[0], now, floor)

    def _judge_down(self, limit: int, rate: float, now: float, floor: int) -> int:
        kept = self._kept
        assert kept is not None
        best = self._peak
        if rate >= best * (1 - MAX_LOSS):
            self.note = (f"held at {limit}: {kept[0]} -> {limit} in flight kept its tokens/s "
                         f"({best:.0f} -> {rate:.0f})")
            self._keep(limit, max(kept[1], rate))
            return self._step_down(limit, now, floor)
        self._down = False
        self.note = (f"held at {kept[0]}: {limit} in flight gave {rate:.0f} tokens/s against "
                     f"{best:.0f}, more than {MAX_LOSS:.0%} less")
        return self._hold(kept[0], limit, now)

    def _keep(self, limit: int, rate: float) -> None:
        self._kept = (limit, rate)
        self._peak = max(self._peak, rate)

    def _step_down(self, kept: int, now: float, floor: int) -> int:
        """The next step below `kept`, or the hold at it once a step would pass the floor."""
        lower = max(floor, round(kept / PROBE_GROWTH))
        self._down = lower < kept
        return lower if self._down else self._hold(kept, kept, now)

    def _hold(self, kept: int, limit: int, now: float) -> int:
        if self._reprobing:  # the first hold is REPROBE_S; then it doubles while probes fail
            self._hold_s = REPROBE_S if self._gained else min(MAX_HOLD_S, 2 * self._hold_s)
        self._held_since = now
        if limit != kept:
            log.info("in-flight limit %d -> %d: %s", limit, kept, self.note)
        return kept


class Pacer:
    """The pure controller: `observe` one reading of the server's load and of this worker's
    in-flight count, get the next limit."""

    def __init__(self, start: int, ceiling: int) -> None:
        self.ceiling = max(1, ceiling)
        self.limit = min(max(1, start), self.ceiling)
        # The most the server ran while requests waited: its slots, as far as seen (0: it has
        # not queued yet). Below them plus the queue the limit doubles; above, it creeps.
        self.slots_seen = 0
        self.rate = RateGate()
        self._last_running: int | None = None
        self._share = 1.0  # this worker's part of the server's load when it last held a queue

    def observe(self, load: Load, in_flight: int, now: float | None = None) -> int:
        queue = held_queue(load.running)
        in_use = in_flight >= self.limit - max(1, self.limit // 8)
        # This worker's part of all the server holds (1 alone; ~1/W of W workers on it).
        share = min(1.0, in_flight / max(1, load.running + load.waiting))
        # A server still taking its waiting requests into free slots (vLLM admits a step's
        # prefill budget at a time: 12 a step here, so 128 sent at once show ~100 waiting at
        # 30 running) is not full: its queue says nothing of its slots yet. The first reading
        # cannot tell, so it waits for the second.
        admitting = self._last_running is None or load.running - self._last_running >= queue
        self._last_running = load.running
        if load.waiting and not admitting:
            # A server holding a queue is one whose counts stand still long enough to read
            # this worker's part in; at the end of a cohort of answers, the gauges (the last
            # step's) lag the refill and every worker would read itself alone.
            self._share = share
        if load.waiting > queue and not admitting:
            self.slots_seen = max(self.slots_seen, load.running)
            # This worker's share of the excess, cut from what it holds now: the same reading
            # again (before any answer came back) gives the same limit, not a second cut.
            cut = math.ceil((load.waiting - queue) * share)
            self.limit = max(1, min(self.limit, in_flight - cut))
            self.rate.forget()
        elif load.waiting == 0 and in_use:
            now = time.monotonic() if now is None else now
            self.limit = min(self.ceiling, self._grown(queue, load, in_flight, now))
        elif not in_use:
            self.rate.forget()
        else:  # a few wait (at most the held queue), or the server is still admitting them
            self.rate.unsettle()
        return self.limit

    def _grown(self, queue: int, load: Load, in_flight: int, now: float) -> int:
        # Back up at once to this worker's part of what the server is known to take: its
        # slots plus the queue, times its share when the server last held a queue (each of W
        # workers to its 1/W, not all W to the whole: two workers on a 128-slot vLLM each went
        # back to 136 and held 272).
        known = math.ceil((self.slots_seen + queue) * self._share) if self.slots_seen else 0
        if self.limit < known:
            return min(known, 2 * self.limit)
        step = queue if self.slots_seen else max(1, round(self.limit * (PROBE_GROWTH - 1)))
        if load.generated is None:  # a kind that counts no tokens: the queue alone says
            return self.limit + (step if self.slots_seen else self.limit)
        # Beyond the slots seen, too, a step is kept only if the rate rose: unjudged, every
        # worker on the engine crept by the queue at each reading, faster than the server's
        # gauges (its last step's) could show the queue they made (two workers: 128 to 189
        # in 2 s).
        floor = self.limit if self.slots_seen else DOWN_FLOOR
        return self.rate.next_limit(self.limit, load, now, step, in_flight=in_flight,
                                    floor=floor)


@dataclass(frozen=True)
class Pace:
    """The limit in force, in the words the heartbeat carries to `run` and `status`."""

    limit: int
    source: str  # where the limit comes from, one line
    paced: bool  # found from the server's queue, and changing with it
    load: Load | None = None  # the server's last reading, where it can be read
    slots: int | None = None  # the running requests the server reports, where it does
    note: str = ""  # the pacer's last decision from the token rate, in words


def beat_fields(pace: Pace | None, pool: int) -> dict[str, int | str]:
    """What the heartbeat says of the limit: `concurrency` is the limit in force (what the
    producer's high-water mark and `status` count), `limit_from` its source; the engine's
    queue where it was read (-1: not read)."""
    if pace is None:  # -c given before the engine answered: Celery's pool is the limit
        return {"concurrency": pool, "limit_from": f"-c {pool}, as given", "paced": 0,
                "limit_max": pool, "engine_running": -1, "engine_waiting": -1,
                "engine_slots": -1, "limit_note": ""}
    load = pace.load
    return {"concurrency": pace.limit, "limit_from": pace.source, "paced": int(pace.paced),
            "limit_max": pool,
            "engine_running": -1 if load is None else load.running,
            "engine_waiting": -1 if load is None else load.waiting,
            "engine_slots": pace.slots or -1, "limit_note": pace.note}


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
        note = self._pacer.rate.note if self._pacer is not None else ""
        self.current = Pace(limit, self.plan.source, self.plan.paced, load, self.plan.slots,
                            note)
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
