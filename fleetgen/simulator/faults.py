"""Fault injection: per-request faults drawn from a seeded stream, and server downtime."""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable

from fleetgen.simulator.config import SimConfig

# A hung request sleeps this long: far past any sane client timeout, and still
# cancellable, so a client that gives up frees it at once.
HANG_S = 3600.0
# What a hung request gets if its wait ever ends (a backstop: the client gives up first).
HANG_ANSWER = (504, "The request hung and was given up by the server (simulated fault).")

# What an unhealthy SGLang deployment answers: its own 500/503, and the 502/504 a
# proxy in front of it adds. Messages are the simulator's own.
ERROR_ANSWERS: tuple[tuple[int, str], ...] = (
    (500, "Internal server error (simulated fault)."),
    (502, "Bad gateway (simulated fault)."),
    (503, "Service unavailable (simulated fault)."),
    (504, "Gateway timeout (simulated fault)."),
)


class Fault(enum.Enum):
    NONE = "none"
    ERROR = "error"
    QUEUE_FULL = "queue_full"
    HANG = "hang"
    DROP = "drop"


class FaultInjector:
    """Draws at most one fault per HTTP request, from one uniform number.

    The stream is seeded per server, so a run with the same traffic order sees
    the same faults; exact reproducibility per request is not promised.
    """

    def __init__(self, config: SimConfig, server_index: int) -> None:
        self._rng = random.Random(config.seed * 1_000_003 + server_index)
        self._bands = (
            (Fault.ERROR, config.error_rate),
            (Fault.QUEUE_FULL, config.queue_full_rate),
            (Fault.HANG, config.hang_rate),
            (Fault.DROP, config.drop_rate),
        )
        self.enabled = any(rate > 0 for _, rate in self._bands)

    def draw(self) -> Fault:
        if not self.enabled:
            return Fault.NONE
        point = self._rng.random()
        for fault, rate in self._bands:
            if point < rate:
                return fault
            point -= rate
        return Fault.NONE

    def error_answer(self) -> tuple[int, str]:
        return self._rng.choice(ERROR_ANSWERS)


class Availability:
    """Whether a server is up: configured down windows, admin downtime, draining, death.

    While down the server keeps its port open and answers 503 on /health and on
    generation endpoints (like an SGLang that is restarting behind a proxy); a
    connection refusal is what `die_after_s` simulates instead.
    """

    def __init__(
        self, config: SimConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._windows = config.down_windows
        self._clock = clock
        self._started = clock()
        self._down_until = 0.0
        # Configured windows that began before the last /_sim/up are over.
        self._up_forced_at_s = -1.0
        self.draining = False
        self.dead = False
        # Every generation request hangs from `/_sim/hang` on while the probes answer 200: a
        # generate path wedged behind a live HTTP server, which only a restart ends.
        self.hung = False

    def start(self) -> None:
        self._started = self._clock()

    def uptime_s(self) -> float:
        return self._clock() - self._started

    def down_for(self, seconds: float) -> None:
        self._down_until = max(self._down_until, self._clock() + seconds)

    def force_up(self) -> None:
        self._down_until = 0.0
        self._up_forced_at_s = self.uptime_s()

    def is_down(self) -> bool:
        if self._clock() < self._down_until:
            return True
        now_s = self.uptime_s()
        return any(
            start_s <= now_s < end_s and start_s > self._up_forced_at_s
            for start_s, end_s in self._windows
        )

    def refusal(self) -> str | None:
        """Why generation is refused right now (the 503 message), or None when up.

        A draining server still accepts work: SGLang's SIGTERM handler only sets
        `gracefully_exit`, which /health and /ready read and /generate does not.
        """
        if self.is_down():
            return "The server is temporarily unavailable (simulated downtime)."
        return None

    def ready(self) -> bool:
        """`TokenizerManager.is_ready`: up and not shutting down."""
        return not self.draining and not self.is_down()
