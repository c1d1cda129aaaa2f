"""The aiohttp app of one simulated SGLang server, a fleet of them, and a threaded runner."""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson
from aiohttp import web

from fleetgen.simulator.answers import compose
from fleetgen.simulator.capacity import InFlight, KvPool, QueueFull, Slots, Ticket, Tickets
from fleetgen.simulator.chat import parse_chat, render_chat, tokenize
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.faults import HANG_S, Availability, Fault, FaultInjector
from fleetgen.simulator.info import server_info
from fleetgen.simulator.metrics import ServerMetrics, render_prometheus
from fleetgen.simulator.model import Completion, per_token_s, tokens_done, ttft_s
from fleetgen.simulator.prefill import Prefill, PrefillLane
from fleetgen.simulator.prefix_cache import PrefixCache, finished_hashes, prefix_hashes
from fleetgen.simulator.protocol import (
    QUEUE_FULL_MESSAGE,
    RUNNING_ABORT_REASON,
    WAITING_ABORT_MESSAGE,
    ApiError,
    Item,
    Job,
    Outcome,
    bad_request,
    native_error_body,
    openai_error_body,
    parse_completions,
    parse_generate,
    render_completions,
    render_native,
    vllm_error_body,
)
from fleetgen.simulator.protocol import (
    InFlight as RidInFlight,
)
from fleetgen.simulator.spec import decode_steps, steps_for

logger = logging.getLogger(__name__)

# SGLang leaves these open even with --api-key (probes and scrapers carry no key);
# the simulator adds its read-only stats.
AUTH_EXEMPT = frozenset({"/health", "/health_generate", "/ready", "/metrics", "/_sim/stats"})
GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
# A batch of long pre-tokenized prompts is several MB of JSON; aiohttp's 1 MiB
# default would refuse what SGLang accepts.
MAX_BODY_BYTES = 256 * 1024 * 1024
# stop() closes connections before cleanup, so aiohttp only waits for stragglers.
SHUTDOWN_GRACE_S = 1.0
HANG_ANSWER = (504, "The request hung and was given up by the server (simulated fault).")
DROPPED = web.RequestKey("fleetgen_sim_dropped", bool)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Api:
    """How one generation endpoint reads requests and shapes answers and errors."""

    parse: Callable[[Any, SimConfig, RidInFlight], Job]
    render: Callable[[Job, list[Outcome], SimConfig], Any]
    error_body: Callable[[ApiError], dict[str, Any]]


NATIVE = Api(parse_generate, render_native, native_error_body)
CHAT = Api(parse_chat, render_chat, openai_error_body)
OPENAI = Api(parse_completions, render_completions, openai_error_body)
VLLM_OPENAI = Api(parse_completions, render_completions, vllm_error_body)


class SimServer:
    """One simulated SGLang server: its own port, slots, queue, faults and metrics."""

    def __init__(self, config: SimConfig, index: int = 0) -> None:
        self.config = config
        self.index = index
        self.port = config.port + index if config.port else 0
        self.metrics = ServerMetrics(
            config.model_name, config.total_slots, config.speed
        )
        self.slots = Slots(
            config.total_slots, config.max_queued_requests, self.metrics.on_running
        )
        self.tickets = Tickets()
        self.kv_pool = KvPool(config.max_total_num_tokens)
        self.prefix_cache = PrefixCache(config.max_total_num_tokens)
        # One GPU's forward passes (a DP server's ranks share it: first order).
        self.prefill_lane = PrefillLane(
            config.prefill_tokens_per_s * config.speed, config.chunked_prefill_size)
        self.in_flight = InFlight()
        self.faults = FaultInjector(config, index)
        self.availability = Availability(config)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._die_timer: asyncio.TimerHandle | None = None
        self._dying: asyncio.Task[None] | None = None
        self._created = int(time.time())
        self._started_at = time.time()

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        runner = web.AppRunner(
            self._build_app(),
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

    def stats(self) -> dict[str, Any]:
        stats = self.metrics.stats(self.slots.running, self.slots.queued)
        stats.update(
            url=self.url,
            port=self.port,
            down=self.availability.is_down(),
            draining=self.availability.draining,
            dead=self.availability.dead,
            in_flight=self.in_flight.count,
            uptime_s=self.availability.uptime_s(),
            # The prompt tokens the GPU computed (the uncached ones, a retraction's twice), in
            # how many forward passes and how long; the cache's hits are cached_tokens_total.
            prefill_tokens_total=self.prefill_lane.tokens_total,
            prefill_chunks_total=self.prefill_lane.chunks_total,
            prefill_busy_seconds_total=self.prefill_lane.busy_s_total,
        )
        return stats

    # ------------------------------------------------------------ app

    def _build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._count_requests, self._check_api_key],
            client_max_size=MAX_BODY_BYTES,
        )
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        # SGLang 0.5.23 and vLLM both render messages on /tokenize (http_server
        # `openai_v1_tokenize`, also /v1/tokenize; vLLM's `tokenize`).
        for path in ("/tokenize", "/v1/tokenize"):
            app.router.add_post(path, self._tokenize)
        if self.config.flavor == "vllm":
            # vLLM's /health is instant and it has no /ready (entrypoints/serve/...).
            app.router.add_get("/health", self._ready)
        else:
            self._add_sglang_routes(app)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/abort_request", self._abort_request)
        app.router.add_post("/_sim/down", self._sim_down)
        app.router.add_post("/_sim/up", self._sim_up)
        app.router.add_get("/_sim/stats", self._sim_stats)
        return app

    def _add_sglang_routes(self, app: web.Application) -> None:
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/v1/chat/completions", self._chat)
        for path in ("/get_server_info", "/server_info"):
            app.router.add_get(path, self._server_info)
        for path in ("/get_model_info", "/model_info"):
            app.router.add_get(path, self._model_info)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/ready", self._ready)

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
                return _json({"error": "Unauthorized"}, 401)
        try:
            return await handler(request)
        except ApiError as error:  # control endpoints; generation ones answer their own
            return _json(native_error_body(error), error.status)

    # ------------------------------------------------------------ generation

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, NATIVE)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, VLLM_OPENAI if self.config.flavor == "vllm" else OPENAI)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        """No slot and no fault: the tokenizer manager answers it without the scheduler."""
        error_body = vllm_error_body if self.config.flavor == "vllm" else openai_error_body
        try:
            return _json(tokenize(await _read_json(request), self.config))
        except ApiError as error:
            return _json(error_body(error), error.status)

    async def _serve(self, request: web.Request, api: Api) -> web.StreamResponse:
        with self.in_flight.track() as leave:
            try:
                refusal = self.availability.refusal()
                if refusal is not None:
                    raise ApiError(503, refusal)
                job = api.parse(await _read_json(request), self.config, self.tickets.__contains__)
                outcomes = await self._execute_reserved(request, job, leave)
                payload, status = api.render(job, outcomes, self.config), 200
            except ApiError as error:
                payload, status = api.error_body(error), error.status
            # Written here, not after return, so a drain waits for the last byte.
            response = _json(payload, status)
            await response.prepare(request)
            await response.write_eof()
            return response

    async def _execute_reserved(
        self, request: web.Request, job: Job, leave: Callable[[], None]
    ) -> list[Outcome]:
        # The rids count as in flight from here to the answer (or the error),
        # which is what the duplicate-rid check of the next request sees.
        tickets = self.tickets.reserve([item.rid for item in job.items])
        try:
            return await self._execute(request, job, tickets, leave)
        finally:
            for ticket in tickets:
                self.tickets.close(ticket)

    async def _execute(
        self, request: web.Request, job: Job, tickets: list[Ticket], leave: Callable[[], None]
    ) -> list[Outcome]:
        # Faults hit only requests that passed validation, so length errors stay
        # exact whatever the fault rates.
        fault = self.faults.draw()
        if fault is not Fault.NONE:
            self.metrics.count_fault(fault.value)
        if fault is Fault.ERROR:
            raise ApiError(*self.faults.error_answer())
        if fault is Fault.QUEUE_FULL:
            raise ApiError(503, QUEUE_FULL_MESSAGE)
        if fault is Fault.DROP:
            await self._drop(request)
        if fault is Fault.HANG:
            leave()  # it never finishes, so a drain must not wait for it
        tasks = [
            asyncio.ensure_future(self._run_item(item, ticket, fault is Fault.HANG))
            for item, ticket in zip(job.items, tickets, strict=True)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except QueueFull:
            raise ApiError(503, QUEUE_FULL_MESSAGE) from None
        finally:
            for task in tasks:
                task.cancel()  # siblings of a failed batch item stop and free their slots

    async def _run_item(self, item: Item, ticket: Ticket, hang: bool) -> Outcome:
        arrived = time.monotonic()
        ticket.task = asyncio.current_task()
        completion = self._answer(item)
        try:
            if hang:
                await asyncio.sleep(HANG_S)
                raise ApiError(*HANG_ANSWER)
            async with self.slots.hold():
                await self._serve_in_slot(item, ticket, completion)
        except asyncio.CancelledError:
            if not ticket.aborted:
                raise
            _uncancel_current_task()
            return self._aborted(item, ticket, completion, arrived)
        self.metrics.count_tokens(item.prompt_tokens, completion.completion_tokens,
                                  ticket.cached_tokens)
        self._count_spec(item, completion.completion_tokens)
        return Outcome(
            item, completion, time.monotonic() - arrived, ticket.cached_tokens,
            ticket.num_retractions,
        )

    def _answer(self, item: Item) -> Completion:
        return compose(
            item.key, self.config.output_tokens_mean, item.max_new_tokens, item.prompt,
            item.style, item.sampling.min_new_tokens, item.sampling.ignore_eos,
        )

    async def _serve_in_slot(self, item: Item, ticket: Ticket, completion: Completion) -> None:
        """Prefill the uncached tokens on the lane, then decode; the ticket records both."""
        config = self.config
        hashes = prefix_hashes(item.prompt)
        ticket.cached_tokens = self.prefix_cache.match(hashes)
        self.prefix_cache.insert(hashes)
        with self.kv_pool.hold(item.prompt_tokens + item.max_new_tokens) as over:
            ticket.num_retractions = 1 if over else 0
            # A retracted request is prefilled a second time when it is re-admitted.
            uncached = max(1, item.prompt_tokens - ticket.cached_tokens)
            prefill = self.prefill_lane.schedule(
                uncached * (1 + ticket.num_retractions), time.monotonic())
            first_token_s = ttft_s(config) * (1 + ticket.num_retractions)
            tokens = completion.completion_tokens
            # One forward pass per token, or per verify step when speculating: the answer
            # takes its steps' time, and an abort sees tokens at the answer's mean pace.
            step_s = per_token_s(config, self.slots.running)
            decode_s = step_s * decode_steps(config, item.key, item.prompt, tokens)
            ticket.start_service(first_token_s, decode_s / tokens if tokens else step_s,
                                 self.prefill_lane, prefill)
            await self._decode_until(prefill, first_token_s + decode_s)
        self.prefix_cache.insert(finished_hashes(hashes, item.prompt, completion))

    async def _decode_until(self, prefill: Prefill, decode_s: float) -> None:
        """Sleep until `decode_s` of decoding after the prefill; a chunk scheduled meanwhile
        (another request's prefill) moves the moment back, so look again on waking. One
        sleep for the whole answer otherwise, which keeps thousands of requests cheap."""
        lane, target = self.prefill_lane, prefill.decode_clock_s + decode_s
        # The clock stands still during the prefill itself: never done before its end.
        while (delay_s := max(lane.time_at(target), prefill.end_s) - time.monotonic()) > 0:
            await asyncio.sleep(delay_s)

    def _aborted(
        self, item: Item, ticket: Ticket, completion: Completion, arrived: float
    ) -> Outcome:
        """Scheduler.abort_request: a waiting request is popped, a running one finishes."""
        self.metrics.aborted_total += 1
        latency_s = time.monotonic() - arrived
        if ticket.service_started is None:
            reason = {"type": "abort", "message": WAITING_ABORT_MESSAGE}
            return Outcome(item, completion.prefix(0, reason), latency_s, waiting_abort=True)
        produced = tokens_done(
            ticket.elapsed_in_service_s(), ticket.first_token_s, ticket.per_token_s,
            completion.completion_tokens,
        )
        partial = completion.prefix(produced, dict(RUNNING_ABORT_REASON))
        self.metrics.count_tokens(item.prompt_tokens, partial.completion_tokens,
                                  ticket.cached_tokens)
        self._count_spec(item, partial.completion_tokens)
        return Outcome(
            item, partial, latency_s, ticket.cached_tokens, ticket.num_retractions
        )

    def _count_spec(self, item: Item, completion_tokens: int) -> None:
        """The verify steps of an answer, into the /metrics counters (vLLM's spec_decode_*)."""
        if self.config.speculative_algorithm is not None:
            self.metrics.count_spec(
                steps_for(self.config, item.key, item.prompt, completion_tokens))

    async def _drop(self, request: web.Request) -> NoReturn:
        request[DROPPED] = True
        if request.transport is not None:
            request.transport.abort()
        # Losing the connection cancels this handler (handler_cancellation) before
        # this wait ends; the error below is only a backstop.
        await asyncio.sleep(HANG_S)
        raise ApiError(*HANG_ANSWER)

    # ------------------------------------------------------------ control

    async def _abort_request(self, request: web.Request) -> web.StreamResponse:
        """http_server `abort_request` -> TokenizerManager.abort_request: always an empty 200."""
        body = await _read_control_body(request)
        rid = body.get("rid")
        if body.get("abort_all"):
            self.tickets.abort_all()
        elif isinstance(rid, str):
            self.tickets.abort(rid)  # "" and unknown rids are ignored
        return web.Response(status=200)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        """http_server `health_generate`: 503 at once when exiting, else a probe polled 1/s."""
        if not self.availability.ready():
            return web.Response(status=503)
        await asyncio.sleep(self.config.health_delay_s)
        return web.Response(status=200 if self.availability.ready() else 503)

    async def _ready(self, request: web.Request) -> web.StreamResponse:
        """http_server `ready`: the instant check."""
        return web.Response(status=200 if self.availability.ready() else 503)

    async def _sim_down(self, request: web.Request) -> web.StreamResponse:
        seconds = (await _read_control_body(request)).get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
            math.isfinite(seconds) and seconds >= 0
        ):
            raise bad_request(f"seconds must be a number >= 0, got {seconds!r}.")
        self.availability.down_for(float(seconds))
        logger.info("%s: down for %.1f s (admin request)", self.url, seconds)
        return _json({"down_for_s": seconds})

    async def _sim_up(self, request: web.Request) -> web.StreamResponse:
        self.availability.force_up()
        return _json({"down": self.availability.is_down()})

    async def _sim_stats(self, request: web.Request) -> web.StreamResponse:
        return _json(self.stats())

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        text = render_prometheus(
            self.metrics.stats(self.slots.running, self.slots.queued), self.config.model_name,
            speculative=self.config.speculative_algorithm is not None
            and self.config.flavor == "vllm",
        )
        return web.Response(
            body=text.encode(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    # ------------------------------------------------------------ info

    async def _models(self, request: web.Request) -> web.StreamResponse:
        name = self.config.model_name
        return _json({"object": "list", "data": [{
            "id": name, "object": "model", "created": self._created,
            "owned_by": "vllm" if self.config.flavor == "vllm" else "sglang",
            "root": name, "max_model_len": self.config.context_length,
        }]})

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        """http_server `server_info`: resolved args at top level, live state per DP rank."""
        return _json(server_info(self.config, self.port, self._started_at))

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        name = self.config.model_name
        return _json({
            "model_path": name, "served_model_name": name, "tokenizer_path": name,
            "is_generation": True, "preferred_sampling_params": None,
            "weight_version": "default", "load_format": "auto",
            "reasoning_parser": self.config.reasoning_parser,
            "tool_call_parser": None, "disaggregation_mode": "null",
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
        })


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


def _close_connections(runner: web.AppRunner, abort: bool) -> None:
    for connection in runner.server.connections if runner.server is not None else []:
        transport = connection.transport
        if transport is None:
            continue
        if abort:
            transport.abort()  # a crash: nothing buffered gets out
        else:
            transport.close()  # flushes what is already written


def _uncancel_current_task() -> None:
    # The cancel came from /abort_request, not from the client: the request goes on
    # to answer, so the pending cancellation must not linger on its task.
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise bad_request(f"The request body is not valid JSON: {error}.") from None


async def _read_control_body(request: web.Request) -> dict[str, Any]:
    body = await _read_json(request)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")
