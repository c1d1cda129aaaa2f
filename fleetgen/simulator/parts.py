"""The parts of one simulated server that its generation routes and its admin endpoints act on
(built by server.py's SimServer, which mounts both)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetgen.simulator.capacity import InFlight
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.faults import Availability, FaultInjector
from fleetgen.simulator.lifecycle import Lifecycle
from fleetgen.simulator.scheduler import Scheduler


@dataclass(frozen=True)
class ServerParts:
    """The engine state (`scheduler`), its faults and availability, the requests in flight and
    the socket (`lifecycle`) of one server."""

    config: SimConfig
    scheduler: Scheduler
    in_flight: InFlight
    faults: FaultInjector
    availability: Availability
    lifecycle: Lifecycle

    @classmethod
    def build(cls, config: SimConfig, index: int) -> ServerParts:
        """Server `index` of a fleet: its port is the config's plus `index` (0: the kernel's)."""
        in_flight, availability = InFlight(), Availability(config)
        lifecycle = Lifecycle(config, config.port + index if config.port else 0,
                              availability, in_flight)
        return cls(config, Scheduler(config), in_flight, FaultInjector(config, index),
                   availability, lifecycle)

    def stats(self) -> dict[str, Any]:
        """/_sim/stats: the scheduler's counters, and where and how the server is."""
        stats = self.scheduler.stats()
        stats.update(
            url=self.lifecycle.url,
            port=self.lifecycle.port,
            down=self.availability.is_down(),
            draining=self.availability.draining,
            dead=self.availability.dead,
            in_flight=self.in_flight.count,
            uptime_s=self.availability.uptime_s(),
        )
        return stats
