"""Running slots with a first-come-first-served waiting queue, and abortable tickets."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


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
    task: asyncio.Task[Any] | None
    aborted: bool = False
    # Set when the request gets a slot; an abort uses them to report partial output.
    service_started: float | None = None
    first_token_s: float = 0.0
    per_token_s: float = 0.0

    def start_service(self, first_token_s: float, per_token_s: float) -> None:
        self.service_started = time.monotonic()
        self.first_token_s = first_token_s
        self.per_token_s = per_token_s

    def elapsed_in_service_s(self) -> float:
        if self.service_started is None:
            return 0.0
        return time.monotonic() - self.service_started


@dataclass
class Tickets:
    """The rid index of generations in flight."""

    by_rid: dict[str, set[Ticket]] = field(default_factory=dict)

    def open(self, rid: str) -> Ticket:
        ticket = Ticket(rid, asyncio.current_task())
        self.by_rid.setdefault(rid, set()).add(ticket)
        return ticket

    def close(self, ticket: Ticket) -> None:
        same_rid = self.by_rid.get(ticket.rid, set())
        same_rid.discard(ticket)
        if not same_rid:
            self.by_rid.pop(ticket.rid, None)

    def abort(self, rid: str) -> int:
        """Cancel every generation with this rid; each then answers 200 with an abort reason."""
        tickets = self.by_rid.get(rid, set())
        for ticket in tickets:
            if not ticket.aborted and ticket.task is not None:
                ticket.aborted = True
                ticket.task.cancel()
        return len(tickets)

    def abort_all(self) -> int:
        return sum(self.abort(rid) for rid in list(self.by_rid))


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
