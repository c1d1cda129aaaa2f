"""Running slots with a first-come-first-served waiting queue, and abortable tickets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleetgen.simulator.prefill import Prefill, PrefillLane


class QueueFull(Exception):
    """The bounded waiting queue has no room; SGLang answers 503 and the client retries."""


class Slots:
    """K running slots; requests beyond K wait in arrival order.

    A released slot is handed straight to the oldest waiter, so a late arrival
    can never overtake a request that is already queued.
    """

    def __init__(
        self,
        limit: int,
        queue_limit: int | None,
        on_running: Callable[[int], None] = lambda running: None,
    ) -> None:
        self.limit = limit
        self.queue_limit = queue_limit
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_running = on_running

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold one slot for the body; raises QueueFull instead of queueing past the bound."""
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        if self.running < self.limit and not self._waiters:
            self._set_running(self.running + 1)
            return
        if self.queue_limit is not None and len(self._waiters) >= self.queue_limit:
            raise QueueFull
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            await turn
        except BaseException:
            if turn.cancelled():
                self._waiters.remove(turn)
            else:
                # The slot was handed over just as we were cancelled: pass it on.
                self._release()
            raise

    def _release(self) -> None:
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot changes hands; `running` stays the same
                return
        self._set_running(self.running - 1)

    def _set_running(self, running: int) -> None:
        self.running = running
        self._on_running(running)


@dataclass(eq=False)
class Ticket:
    """One generation in flight, findable by rid so /abort_request can end it."""

    rid: str
    task: asyncio.Task[Any] | None = None
    aborted: bool = False
    # Set when the request gets a slot; an abort uses them to report partial output.
    service_started: float | None = None
    first_token_s: float = 0.0
    per_token_s: float = 0.0
    cached_tokens: int = 0
    num_retractions: int = 0
    # Its server's prefill lane and its own prefill: the time it has decoded since leaves
    # out the chunks other requests' prefills took.
    lane: PrefillLane | None = None
    prefill: Prefill | None = None

    def start_service(self, first_token_s: float, per_token_s: float,
                      lane: PrefillLane, prefill: Prefill) -> None:
        self.service_started = time.monotonic()
        self.first_token_s = first_token_s
        self.per_token_s = per_token_s
        self.lane = lane
        self.prefill = prefill

    def elapsed_in_service_s(self) -> float:
        """Decode-clock seconds since its prefill ended (negative while it is prefilled)."""
        if self.lane is None or self.prefill is None:
            return 0.0
        now = time.monotonic()
        if now < self.prefill.end_s:
            return now - self.prefill.end_s
        return self.lane.decode_clock(now) - self.prefill.decode_clock_s

    def abort(self) -> None:
        self.aborted = True
        if self.task is not None:
            self.task.cancel()


@dataclass
class Tickets:
    """The rids in flight: the duplicate check, and what /abort_request matches."""

    by_rid: dict[str, Ticket] = field(default_factory=dict)

    def __contains__(self, rid: object) -> bool:
        return rid in self.by_rid

    def reserve(self, rids: list[str]) -> list[Ticket]:
        """Register a request's rids from arrival on (the parser refused duplicates)."""
        tickets = [Ticket(rid) for rid in rids]
        for ticket in tickets:
            self.by_rid[ticket.rid] = ticket
        return tickets

    def close(self, ticket: Ticket) -> None:
        if self.by_rid.get(ticket.rid) is ticket:
            del self.by_rid[ticket.rid]

    def abort(self, rid: str) -> int:
        """TokenizerManager.abort_request then Scheduler.abort_request.

        The tokenizer forwards an abort only for a rid it holds exactly; the
        scheduler then ends every request whose rid starts with it.
        """
        if not rid or rid not in self.by_rid:
            return 0
        matched = [t for r, t in self.by_rid.items() if r.startswith(rid) and not t.aborted]
        for ticket in matched:
            ticket.abort()
        return len(matched)

    def abort_all(self) -> int:
        matched = [t for t in self.by_rid.values() if not t.aborted]
        for ticket in matched:
            ticket.abort()
        return len(matched)


class KvPool:
    """Tokens promised to running requests; a request that does not fit is retracted once.

    SGLang retracts running requests under KV pressure and re-queues them
    (meta_info.num_retractions); the simulator charges the newcomer one extra
    prefill instead of moving tokens around, which keeps service times predictable.
    """

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.used_tokens = 0

    @contextlib.contextmanager
    def hold(self, tokens: int) -> Iterator[bool]:
        """Hold `tokens` for the body; yields True when the pool was over capacity."""
        over = self.used_tokens + tokens > self.capacity_tokens
        self.used_tokens += tokens
        try:
            yield over
        finally:
            self.used_tokens -= tokens


class InFlight:
    """Counts HTTP requests a drain must wait for, up to their last byte written."""

    def __init__(self) -> None:
        self.count = 0
        self.idle = asyncio.Event()
        self.idle.set()

    @contextlib.contextmanager
    def track(self) -> Iterator[Callable[[], None]]:
        """Count the body; it receives a `leave` callback to stop counting early (hangs)."""
        counted = True

        def leave() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.count -= 1
                if self.count == 0:
                    self.idle.set()

        self.count += 1
        self.idle.clear()
        try:
            yield leave
        finally:
            leave()
