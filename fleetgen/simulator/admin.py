"""How one simulated server is run and overseen: its listening socket (start, drain, stop,
a simulated crash) and its probe, metrics and admin endpoints (aborts, down windows, stats)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from fleetgen.simulator.capacity import InFlight
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.faults import Availability
from fleetgen.simulator.httpio import json_response, read_control_body
from fleetgen.simulator.metrics import render_prometheus
from fleetgen.simulator.protocol import bad_request

if TYPE_CHECKING:
    from fleetgen.simulator.server import SimServer

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


class Admin:
    """The endpoints that watch and steer a server rather than generate: health probes,
    /metrics, /abort_request and the simulator's own /_sim/down, /_sim/up and /_sim/stats."""

    def __init__(self, server: SimServer) -> None:
        self.server = server
        self.config = server.config
        self.availability = server.availability

    def mount(self, app: web.Application) -> None:
        # Scrapers and the tests read these on every flavour.
        app.add_routes([web.get("/metrics", self._metrics),
                        web.get("/_sim/stats", self._sim_stats)])
        if self.config.flavor == "llama":
            app.router.add_get("/health", self._llama_health)
            return
        app.add_routes([*self._probes(), web.post("/abort_request", self._abort_request),
                        web.post("/_sim/down", self._sim_down), web.post("/_sim/up", self._sim_up)])

    def _probes(self) -> list[web.RouteDef]:
        if self.config.flavor == "vllm":
            # vLLM's /health is instant and it has no /ready (entrypoints/serve/...).
            return [web.get("/health", self._ready)]
        return [web.get("/health", self._health), web.get("/health_generate", self._health),
                web.get("/ready", self._ready)]

    async def _health(self, request: web.Request) -> web.StreamResponse:
        """http_server `health_generate`: 503 at once when exiting, else a probe polled 1/s."""
        if not self.availability.ready():
            return web.Response(status=503)
        await asyncio.sleep(self.config.health_delay_s)
        return web.Response(status=200 if self.availability.ready() else 503)

    async def _ready(self, request: web.Request) -> web.StreamResponse:
        """http_server `ready`: the instant check."""
        return web.Response(status=200 if self.availability.ready() else 503)

    async def _llama_health(self, request: web.Request) -> web.StreamResponse:
        ready = self.availability.ready()
        return json_response({"status": "ok"} if ready else
                             {"error": {"code": 503, "message": "Loading model",
                                        "type": "unavailable_error"}},
                             200 if ready else 503)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        scheduler = self.server.scheduler
        text = render_prometheus(
            scheduler.metrics.stats(scheduler.slots.running, scheduler.slots.queued),
            self.config.model_name,
            speculative=self.config.speculative_algorithm is not None
            and self.config.flavor == "vllm",
            flavor=self.config.flavor,
        )
        return web.Response(
            body=text.encode(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def _abort_request(self, request: web.Request) -> web.StreamResponse:
        """http_server `abort_request` -> TokenizerManager.abort_request: always an empty 200."""
        body = await read_control_body(request)
        rid = body.get("rid")
        tickets = self.server.scheduler.tickets
        if body.get("abort_all"):
            tickets.abort_all()
        elif isinstance(rid, str):
            tickets.abort(rid)  # "" and unknown rids are ignored
        return web.Response(status=200)

    async def _sim_down(self, request: web.Request) -> web.StreamResponse:
        seconds = (await read_control_body(request)).get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
            math.isfinite(seconds) and seconds >= 0
        ):
            raise bad_request(f"seconds must be a number >= 0, got {seconds!r}.")
        self.availability.down_for(float(seconds))
        logger.info("%s: down for %.1f s (admin request)", self.server.url, seconds)
        return json_response({"down_for_s": seconds})

    async def _sim_up(self, request: web.Request) -> web.StreamResponse:
        self.availability.force_up()
        return json_response({"down": self.availability.is_down()})

    async def _sim_stats(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.server.stats())


def _close_connections(runner: web.AppRunner, abort: bool) -> None:
    for connection in runner.server.connections if runner.server is not None else []:
        transport = connection.transport
        if transport is None:
            continue
        if abort:
            transport.abort()  # a crash: nothing buffered gets out
        else:
            transport.close()  # flushes what is already written
