"""One simulated SGLang server assembled from its parts (scheduler, routes, admin), a fleet
of them, and a threaded runner."""

from __future__ import annotations

import asyncio
import hmac
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from fleetgen.simulator.admin import Admin
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.httpio import json_response
from fleetgen.simulator.parts import ServerParts
from fleetgen.simulator.request import ApiError
from fleetgen.simulator.routes import DROPPED, Routes
from fleetgen.simulator.sglang_api import native_error_body

# SGLang leaves these open even with --api-key (probes and scrapers carry no key);
# the simulator adds its read-only stats.
AUTH_EXEMPT = frozenset({"/health", "/health_generate", "/ready", "/metrics", "/_sim/stats"})
GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
# A batch of long pre-tokenized prompts is several MB of JSON; aiohttp's 1 MiB
# default would refuse what SGLang accepts.
MAX_BODY_BYTES = 256 * 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SimServer:
    """One simulated SGLang server: its own port, slots, queue, faults and metrics.

    The engine state lives in `scheduler`, the generation and info endpoints in `routes`,
    the probes and admin endpoints in `admin`, the socket in `lifecycle`."""

    def __init__(self, config: SimConfig, index: int = 0) -> None:
        self.config = config
        self.index = index
        self.parts = ServerParts.build(config, index)
        self.scheduler, self.in_flight = self.parts.scheduler, self.parts.in_flight
        self.faults, self.availability = self.parts.faults, self.parts.availability
        self.lifecycle = self.parts.lifecycle
        self.routes = Routes(self.parts)
        self.admin = Admin(self.parts)
        # What a test or a bench looks at most, by the names it has always had.
        self.metrics, self.slots = self.scheduler.metrics, self.scheduler.slots
        self.prefill_lane = self.scheduler.prefill_lane

    @property
    def port(self) -> int:
        """The port it listens on: the kernel's choice once started, with port 0."""
        return self.lifecycle.port

    @property
    def url(self) -> str:
        return self.lifecycle.url

    async def start(self) -> None:
        await self.lifecycle.start(self._build_app())

    async def drain(self, timeout_s: float) -> bool:
        """/health and /ready turn 503; wait until nothing is in flight; False on timeout."""
        return await self.lifecycle.drain(timeout_s)

    async def stop(self) -> None:
        await self.lifecycle.stop()

    async def die(self) -> None:
        """Crash: stop listening and cut every open connection, answered or not."""
        await self.lifecycle.die()

    def stats(self) -> dict[str, Any]:
        return self.parts.stats()

    def _build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._count_requests, self._check_api_key],
            client_max_size=MAX_BODY_BYTES,
        )
        self.routes.mount(app)
        self.admin.mount(app)
        return app

    @web.middleware
    async def _count_requests(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in GENERATION_PATHS:
            return await handler(request)
        code = "499"  # the client went away before an answer (nginx's convention)
        try:
            response = await handler(request)
            code = str(response.status)
            return response
        finally:
            self.metrics.count_request("dropped" if request.get(DROPPED) else code)

    @web.middleware
    async def _check_api_key(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.config.api_key
        if key and request.path not in AUTH_EXEMPT:
            sent = request.headers.get("Authorization", "").encode("utf-8", "replace")
            if not hmac.compare_digest(sent, f"Bearer {key}".encode()):
                return json_response({"error": "Unauthorized"}, 401)
        try:
            return await handler(request)
        except ApiError as error:  # control endpoints; generation ones answer their own
            return json_response(native_error_body(error), error.status)


class SimFleet:
    """`config.count` independent servers on consecutive ports, in one event loop."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.servers = [SimServer(config, index) for index in range(config.count)]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    async def start(self) -> None:
        try:
            for server in self.servers:
                await server.start()
        except BaseException:
            await self.stop()
            raise

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Drain every server at once; True when nothing was left in flight."""
        timeout = self.config.drain_timeout_s if timeout_s is None else timeout_s
        return all(await asyncio.gather(*(server.drain(timeout) for server in self.servers)))

    async def stop(self) -> None:
        await asyncio.gather(*(server.stop() for server in self.servers))

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class SimThread:
    """A fleet served by an event loop in a daemon thread (for tests and benchmarks)."""

    def __init__(
        self, fleet: SimFleet, loop: asyncio.AbstractEventLoop, thread: threading.Thread
    ) -> None:
        self.fleet = fleet
        self.loop = loop
        self._thread = thread
        self._stopped = False

    @property
    def urls(self) -> list[str]:
        return self.fleet.urls

    @property
    def url(self) -> str:
        return self.fleet.urls[0]

    def run(self, make: Callable[[], Awaitable[Any]], timeout_s: float = 30.0) -> Any:
        """Run `make()` on the fleet's loop (e.g. `lambda: server.die()`); return its result."""
        async def call() -> Any:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout_s)

    def stop(self, drain_timeout_s: float = 0.0, timeout_s: float = 30.0) -> None:
        """Drain for up to `drain_timeout_s`, close every server and end the thread."""
        if self._stopped:
            return
        self._stopped = True

        async def shut_down() -> None:
            if drain_timeout_s > 0:
                await self.fleet.drain(drain_timeout_s)
            await self.fleet.stop()
            await _cancel_leftover_tasks()

        try:
            self.run(shut_down, timeout_s)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                self.loop.close()

    def __enter__(self) -> SimThread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_in_thread(config: SimConfig, start_timeout_s: float = 30.0) -> SimThread:
    """Start a fleet on a fresh event loop in a daemon thread; returns once it listens."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fleetgen-sim", daemon=True)
    thread.start()
    fleet = SimFleet(config)
    try:
        asyncio.run_coroutine_threadsafe(fleet.start(), loop).result(start_timeout_s)
    except BaseException:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(start_timeout_s)
        if not thread.is_alive():
            loop.close()
        raise
    return SimThread(fleet, loop, thread)


async def _cancel_leftover_tasks() -> None:
    current = asyncio.current_task()
    leftovers = [task for task in asyncio.all_tasks() if task is not current]
    for task in leftovers:
        task.cancel()
    await asyncio.gather(*leftovers, return_exceptions=True)
