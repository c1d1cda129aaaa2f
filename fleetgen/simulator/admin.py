"""How one simulated server is overseen: its probe, metrics and admin endpoints (aborts, down
windows, stats), acting on the server's parts."""

from __future__ import annotations

import asyncio
import logging
import math

from aiohttp import web

from fleetgen.simulator.httpio import json_response, read_control_body
from fleetgen.simulator.metrics import render_prometheus
from fleetgen.simulator.parts import ServerParts
from fleetgen.simulator.request import bad_request

logger = logging.getLogger(__name__)


class Admin:
    """The endpoints that watch and steer a server rather than generate: health probes,
    /metrics, /abort_request and the simulator's own /_sim/down, /_sim/up, /_sim/hang and
    /_sim/stats."""

    def __init__(self, parts: ServerParts) -> None:
        self.parts = parts
        self.config = parts.config
        self.availability = parts.availability

    def mount(self, app: web.Application) -> None:
        # Scrapers and the tests read these on every flavour.
        app.add_routes([web.get("/metrics", self._metrics),
                        web.get("/_sim/stats", self._sim_stats)])
        if self.config.flavor == "llama":
            app.router.add_get("/health", self._llama_health)
            return
        app.add_routes([*self._probes(), web.post("/abort_request", self._abort_request),
                        web.post("/_sim/down", self._sim_down), web.post("/_sim/up", self._sim_up),
                        web.post("/_sim/hang", self._sim_hang)])

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
        scheduler = self.parts.scheduler
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
        tickets = self.parts.scheduler.tickets
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
        logger.info("%s: down for %.1f s (admin request)", self.parts.lifecycle.url, seconds)
        return json_response({"down_for_s": seconds})

    async def _sim_up(self, request: web.Request) -> web.StreamResponse:
        self.availability.force_up()
        return json_response({"down": self.availability.is_down()})

    async def _sim_hang(self, request: web.Request) -> web.StreamResponse:
        """From now on every generation request hangs (until its client gives up) while the
        probes still answer 200; only a new process ends it."""
        self.availability.hung = True
        logger.info("%s: every request hangs from now on (admin request)",
                    self.parts.lifecycle.url)
        return json_response({"hung": True})

    async def _sim_stats(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.parts.stats())
