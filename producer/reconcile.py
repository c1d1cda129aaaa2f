"""Reconciliation: find rows that have no outcome and are neither queued nor held by a worker
(lost to a Redis crash, or to a worker killed between taking a message and recording it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import redis

from fleetgen.base.contract import RunKeys
from fleetgen.base.wire import lines_in_flight
from producer.manifest import RunManifest

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
        self.manifest = RunManifest(client, run)

    def done(self) -> Bits:
        return Bits(self.redis.get(self.keys.done))

    def in_flight(self) -> set[int]:
        return lines_in_flight(self.redis, self.run)

    def lost_lines(self) -> set[int]:
        """Lines with no outcome that are neither queued nor held by a worker."""
        total = self.manifest.total()
        done = self.done()
        in_flight = self.in_flight()
        return {n for n in done.missing(1, total) if n not in in_flight}

    def wait_until_generated(self, requeue: Callable[[set[int]], None], interval_s: float = 30.0,
                             should_stop: Callable[[], bool] = lambda: False,
                             on_tick: Callable[[int, int], None] | None = None) -> int:
        """Wait until every line has an outcome. A line seen lost at two checks in a row (so
        not merely between a worker's BRPOP and its bookkeeping) is handed to `requeue`.
        Returns how many lines were re-enqueued."""
        total = self.manifest.total()
        suspects: set[int] = set()
        requeued = 0
        next_check = time.monotonic() + interval_s
        while not should_stop():
            generated = int(self.redis.bitcount(self.keys.done))
            if on_tick:
                on_tick(generated, total)
            if generated >= total:
                break
            if time.monotonic() >= next_check:
                lost = self.lost_lines()
                confirmed = lost & suspects
                if confirmed:
                    log.warning("re-enqueueing %d line(s) that were lost (neither queued, in "
                                "flight nor done)", len(confirmed))
                    requeue(confirmed)
                    requeued += len(confirmed)
                suspects = lost - confirmed
                next_check = time.monotonic() + interval_s
            time.sleep(min(0.5, interval_s))
        return requeued
