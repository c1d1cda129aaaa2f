"""Reconciliation: find rows that have no outcome and are neither queued nor held by a worker
(lost to a Redis crash, or to a worker killed between taking a message and recording it). The
run object (producer/loop.py) looks at these and decides; nothing here waits or sends."""

from __future__ import annotations

import redis

from fleetgen.queue.wire import slots_in_flight
from fleetgen.runstate.bitmap import Bits
from fleetgen.runstate.keys import RunKeys


class Reconciler:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.redis = client
        self.run = keys.run
        self.keys = keys

    def done(self) -> Bits:
        return Bits(self.redis.get(self.keys.done))

    def done_count(self) -> int:
        return int(self.redis.bitcount(self.keys.done))

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


class Suspects:
    """Slots seen lost at the last check. Lost at two checks in a row, a slot is lost indeed:
    not merely between a worker's BRPOP and its bookkeeping. The one place that rule lives,
    for both turn modes."""

    def __init__(self) -> None:
        self.slots: set[int] = set()

    def confirm(self, lost: set[int]) -> set[int]:
        """The slots of `lost` that were suspected already; the others are suspected now."""
        confirmed = lost & self.slots
        self.slots = lost - confirmed
        return confirmed
