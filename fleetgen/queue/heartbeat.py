"""A worker's heartbeat: the hash it writes every health interval (workers/gate.py), and the one
reading of it that `status`, the live page and `metrics` share: alive or lost, what it holds,
and when a lost worker's prompts are back in the queue.

Each beat also renews the worker's lease on every prompt it holds (fleetgen/queue/broker.py
`QoS.beat`), so the two lapse together: a worker whose beats stop is lost after
LOST_AFTER_BEATS intervals, and the prompts it held are handed to the others by the next sweep
once the visibility timeout has passed since its last beat (docs/design.md "Leases"). Both
are on Valkey's clock (fleetgen/queue/serverclock.py): a beat's `at` is Valkey's time of its
renewal, and every reader's `now` is Valkey's too."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

# Beats missed before a worker counts as lost: one late beat (a busy consumer loop, a slow
# Redis) is not a death.
LOST_AFTER_BEATS = 3
# What a reader assumes of a heartbeat written before these fields existed.
DEFAULT_INTERVAL_S = 2.0


def ttl_s(interval_s: float, lease_s: float, sweep_s: float) -> int:
    """How long the hash outlives the last beat: until that worker's prompts are surely back
    in the queue (lease, then a sweep), so a lost worker is on view the whole time it holds
    any; then it disappears by itself."""
    return math.ceil(lease_s + 2 * sweep_s + interval_s)


def lease_fields(*, interval_s: float, lease_s: float, sweep_s: float, held: int
                 ) -> dict[str, float]:
    """The lease part of a beat but its times: the beat's script (fleetgen/queue/broker.py
    `QoS.beat`) adds `at` and `skew_s` from Valkey's clock; the gate adds the engine's state."""
    return {"interval_s": interval_s, "lease_s": lease_s, "sweep_s": sweep_s, "held": held}


def fields(*, interval_s: float, lease_s: float, sweep_s: float, held: int,
           now: float | None = None, skew_s: float = 0.0) -> dict[str, float]:
    """A whole beat's lease part, as `QoS.beat` writes it. `now` is Valkey's time of the
    renewal (fleetgen/queue/serverclock.py): readers compare it with Valkey's clock, never
    with their own. `skew_s`: the worker's clock less Valkey's, for the operator to see."""
    return {"at": time.time() if now is None else now, "skew_s": round(skew_s, 3),
            **lease_fields(interval_s=interval_s, lease_s=lease_s, sweep_s=sweep_s, held=held)}


@dataclass(frozen=True)
class Heartbeat:
    at: float
    interval_s: float
    lease_s: float | None  # None: a beat from a worker that renews no leases
    sweep_s: float | None
    held: int | None  # prompts it held (delivered, not acked) at `at`
    skew_s: float | None = None  # the worker's clock less Valkey's at `at`

    @classmethod
    def of(cls, beat: Mapping[str, str]) -> Heartbeat:
        def number(name: str) -> float | None:
            try:
                return float(beat[name])
            except (KeyError, ValueError):
                return None

        held = number("held")
        return cls(at=number("at") or 0.0,
                   interval_s=number("interval_s") or DEFAULT_INTERVAL_S,
                   lease_s=number("lease_s"), sweep_s=number("sweep_s"),
                   held=None if held is None else int(held), skew_s=number("skew_s"))

    def age_s(self, now: float) -> float:
        return max(now - self.at, 0.0)

    def lost(self, now: float) -> bool:
        return self.age_s(now) > LOST_AFTER_BEATS * self.interval_s

    def back_in_s(self, now: float) -> float | None:
        """Seconds until a lost worker's prompts are back in the queue at the latest (0: due,
        at the next sweep); None if the beat does not say its lease."""
        if self.lease_s is None:
            return None
        return max(self.at + self.lease_s + (self.sweep_s or 0.0) - now, 0.0)
