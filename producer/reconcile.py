"""Reconciliation: find rows that have no outcome and are neither queued nor held by a worker
(lost to a Redis crash, or to a worker killed between taking a message and recording it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import redis

from fleetgen.base.contract import RunKeys
from fleetgen.base.wire import slots_in_flight

log = logging.getLogger("fleetgen.producer")


class Bits:
    """A Redis bitmap read once (bit 0 is the most significant bit of byte 0)."""

    def __init__(self, raw: bytes | str | None) -> None:
        self.raw = raw.encode() if isinstance(raw, str) else (raw or b"")

    def __contains__(self, line: int) -> bool:
        byte = line >> 3
        return byte < len(self.raw) and bool(self.raw[byte] & (0x80 >> (line & 7)))

    def missing(self, first: int, last: int) -> Iterator[int]:
        """Lines in first..last whose bit is clear; whole bytes of set bits are skipped, so a
        nearly finished 10-million-row run is scanned in a fraction of a second."""
        raw = self.raw.ljust((last >> 3) + 1, b"\0")
        for index in range(first >> 3, (last >> 3) + 1):
            if raw[index] == 0xFF:
                continue
            for bit in range(8):
                line = (index << 3) | bit
                if first <= line <= last and not raw[index] & (0x80 >> bit):
                    yield line


class Reconciler:
    def __init__(self, client: redis.Redis, run: str) -> None:
        self.redis = client
        self.run = run
        self.keys = RunKeys(run)

    def done(self) -> Bits:
        return Bits(self.redis.get(self.keys.done))

    def in_flight(self) -> set[int]:
        return slots_in_flight(self.redis, self.run)

    def retrying(self) -> int:
        """Slots `fleetgen retry` sent back: failed in the files, but not done."""
        return int(self.redis.scard(self.keys.retrying))

    def unwritten(self) -> int:
        """Outcomes the files will still gain: slots `fleetgen retry` sent back, and stream
        entries the drainer has not written yet (it deletes an entry once its line is in the
        file). A worker's outcome moves a retried slot from the one to the other in one
        script (workers/sink.py), so the sum never passes through 0 on the way to the file."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.scard(self.keys.retrying)
        pipe.xlen(self.keys.stream)
        retrying, unread = pipe.execute()
        return int(retrying) + int(unread)

    def lost_lines(self, total: int) -> set[int]:
        """Lines with no outcome that are neither queued nor held by a worker. `total` is
        the producer's own count: the manifest's may have been lost with the rest."""
        done = self.done()
        in_flight = self.in_flight()
        return {n for n in done.missing(1, total) if n not in in_flight}

    def wait_until_generated(self, requeue: Callable[[set[int]], None], total: int,
                             reassert: Callable[[], bool] = lambda: False,
                             interval_s: float = 30.0,
                             should_stop: Callable[[], bool] = lambda: False,
                             on_tick: Callable[[int, int], None] | None = None,
                             each_look: Callable[[], object] = lambda: None) -> int:
        """Wait until every line has an outcome. At every tick `reassert` writes the run's
        total and state again if Redis forgot them, and `each_look` runs (the affinity's
        sweep); a line seen lost at two checks in a row (so not merely between a worker's
        BRPOP and its bookkeeping) is handed to `requeue`. Returns how many lines were
        re-enqueued."""
        waiter = _Waiter(self, requeue, total, interval_s)
        while not should_stop():
            try:
                each_look()
                if waiter.tick(reassert, on_tick):
                    break
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Past the client's own retries: keep waiting, Redis may come back.
                log.warning("Redis unreachable while waiting for the run (%s); retrying", exc)
            time.sleep(min(0.5, interval_s))  # the poll period; SIGTERM ends it at once
        return waiter.requeued


class _Waiter:
    """The state of one wait: lines suspected lost at the last check, lines re-enqueued."""

    def __init__(self, reconciler: Reconciler, requeue: Callable[[set[int]], None], total: int,
                 interval_s: float) -> None:
        self.r = reconciler
        self.requeue = requeue
        self.total = total
        self.interval_s = interval_s
        self.suspects: set[int] = set()
        self.requeued = 0
        self.next_check = time.monotonic() + interval_s

    def tick(self, reassert: Callable[[], bool],
             on_tick: Callable[[int, int], None] | None) -> bool:
        """One look at the run; True once every line has an outcome."""
        if reassert():
            log.warning("the run's manifest had lost its total or state (Redis restarted "
                        "from an older copy?); re-asserted total=%d", self.total)
        generated = int(self.r.redis.bitcount(self.r.keys.done))
        if on_tick:
            on_tick(generated, self.total)
        if generated >= self.total:
            return True
        if time.monotonic() >= self.next_check:
            self.reconcile()
        return False

    def reconcile(self) -> None:
        lost = self.r.lost_lines(self.total)
        confirmed = lost & self.suspects
        if confirmed:
            log.warning("re-enqueueing %d line(s) that were lost (neither queued, in "
                        "flight nor done)", len(confirmed))
            self.requeue(confirmed)
            self.requeued += len(confirmed)
        self.suspects = lost - confirmed
        self.next_check = time.monotonic() + self.interval_s
