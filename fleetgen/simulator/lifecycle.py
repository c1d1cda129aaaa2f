"""One simulated server's listening socket: start, a drain that waits for requests in flight,
a clean stop and a simulated crash."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from aiohttp import web

from fleetgen.simulator.capacity import InFlight
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.faults import Availability

logger = logging.getLogger(__name__)

# stop() closes connections before cleanup, so aiohttp only waits for stragglers.
SHUTDOWN_GRACE_S = 1.0


@dataclass
class Lifecycle:
    """One server's socket: listening, a drain that waits for requests in flight, a clean
    stop and a simulated crash. `port` 0 until started asks the kernel for one."""

    config: SimConfig
    port: int
    availability: Availability
    in_flight: InFlight
    _runner: web.AppRunner | None = field(default=None, init=False)
    _site: web.TCPSite | None = field(default=None, init=False)
    _die_timer: asyncio.TimerHandle | None = field(default=None, init=False)
    _dying: asyncio.Task[None] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    async def start(self, app: web.Application) -> None:
        runner = web.AppRunner(
            app,
            handler_cancellation=True,  # a client that disconnects frees its slot
            access_log=None,
            shutdown_timeout=SHUTDOWN_GRACE_S,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site
        self.port = runner.addresses[0][1]
        self.availability.start()
        if self.config.die_after_s is not None:
            loop = asyncio.get_running_loop()
            self._die_timer = loop.call_later(self.config.die_after_s, self._die_now)
        logger.info("simulated SGLang server listening on %s", self.url)

    async def drain(self, timeout_s: float) -> bool:
        """/health and /ready turn 503; wait until nothing is in flight; False on timeout.

        New generation requests are still served meanwhile and extend the drain,
        as in `TokenizerManager.sigterm_watchdog`.
        """
        self.availability.draining = True
        try:
            await asyncio.wait_for(self.in_flight.idle.wait(), timeout_s)
        except TimeoutError:
            logger.warning("%s: %d request(s) still in flight after %.1f s of drain",
                           self.url, self.in_flight.count, timeout_s)
            return False
        return True

    async def stop(self) -> None:
        if self._die_timer is not None:
            self._die_timer.cancel()
        if self._runner is None:
            return
        runner, self._runner, self._site = self._runner, None, None
        _close_connections(runner, abort=False)
        # Closed connections cancel their handlers; waiting for that here spares
        # aiohttp's cleanup its per-connection grace period.
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while runner.server is not None and runner.server.connections:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)  # a bounded wait on a condition, not a delay
        await runner.cleanup()

    async def die(self) -> None:
        """Crash: stop listening and cut every open connection, answered or not."""
        self.availability.dead = True
        if self._site is not None:
            site, self._site = self._site, None
            await site.stop()
        if self._runner is not None:
            _close_connections(self._runner, abort=True)
        logger.warning("%s: died (simulated crash)", self.url)

    def _die_now(self) -> None:
        self._dying = asyncio.ensure_future(self.die())


def _close_connections(runner: web.AppRunner, abort: bool) -> None:
    for connection in runner.server.connections if runner.server is not None else []:
        transport = connection.transport
        if transport is None:
            continue
        if abort:
            transport.abort()  # a crash: nothing buffered gets out
        else:
            transport.close()  # flushes what is already written
