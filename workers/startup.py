"""A worker's start-up against its engine: wait for it to answer, refuse one whose answers it
cannot use, and plan its in-flight limit: the running requests it reports, else paced from its
queue (workers/pacing.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from fleetgen import engine, exitcodes
from fleetgen.engine import EngineProtocol, ServerLimits, sglang
from fleetgen.engine.load import LoadReader, gauges_of
from fleetgen.errors import ConfigError, EngineError, PermanentError
from workers.pacing import START_LIMIT, LimitPlan
from workers.settings import WorkerSettings

# A reported slot count this large is SGLang's own default, a bound, not a batch to fill. Without
# --max-running-requests, SGLang 0.5.23 takes max(min(tokens / context * 512, 4096), 2048),
# at most tokens // 2 (mem_cache/kv_cache_configurator.py `resolve_max_num_reqs`): 4,096 for
# the CPU tier's 65,536-token pool, where K + 1 = 4097 sent a whole 120-row run at once, to
# the first server ready. Such a worker paces by the server's token rate, as for vLLM, with
# K + 1 as its ceiling; a count below it (given by hand, or a pool under 4,096 tokens) is held
# as K + 1 from the start.
SGLANG_DEFAULT_SLOTS_LEAST = 2048

log = logging.getLogger("fleetgen.worker")

WAIT_LOG_EVERY_S = 30.0
RETRY_EVERY_S = 1.0
# The limit against a server that reports neither its slots nor its queue (a proxy; vLLM with
# --disable-log-stats): a GPU server's common batch, said in the log and the heartbeat.
FALLBACK_LIMIT = 64


class StartupRefused(Exception):
    """The worker cannot start against this engine: `code` is its exit code, the message one
    line with the cause and the fix."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


T = TypeVar("T")


def resolve_protocol(settings: WorkerSettings, *, wait: bool,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> EngineProtocol | None:
    """FLEETGEN_ENGINE_PROTOCOL, or the protocol the engine answers (detection needs it up:
    waited for when `wait`, else None and the runtime detects it once the gate opens)."""
    url, key = settings.engine_url, settings.engine_api_key

    def resolve() -> EngineProtocol:
        return engine.resolve(settings.engine_protocol, url, key)

    try:
        return _waiting(settings, resolve, sleep, clock) if wait else resolve()
    except ConfigError as exc:
        raise StartupRefused(str(exc), exitcodes.CONFIG) from None
    except EngineError:
        return None  # with -c: the runtime resolves it once the health gate has seen it up


def wait_for_limits(proto: EngineProtocol, settings: WorkerSettings, *,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> ServerLimits:
    """The engine's limits, once it answers. SGLang keeps its port closed while it loads the
    weights (minutes for a large model), so a worker started beside it waits rather than
    guessing a pool size; past FLEETGEN_ENGINE_WAIT_S it gives up."""
    url = settings.engine_url
    return _waiting(settings, lambda: proto.read_limits(url, api_key=settings.engine_api_key,
                                                         timeout_s=5.0), sleep, clock)


def _waiting(settings: WorkerSettings, call: Callable[[], T],
             sleep: Callable[[float], None], clock: Callable[[], float]) -> T:
    url = settings.engine_url
    deadline = clock() + settings.engine_wait_s
    next_log = clock()
    while True:
        try:
            return call()
        except PermanentError as exc:
            raise StartupRefused(f"engine {url} refused the limits request: {exc.message}",
                                 exitcodes.CONFIG) from None
        except EngineError as exc:
            now = clock()
            if now >= deadline:
                raise StartupRefused(
                    f"engine {url} did not answer within FLEETGEN_ENGINE_WAIT_S="
                    f"{settings.engine_wait_s:g} s ({exc.message}); start it, or pass -c to "
                    "start without it", exitcodes.UNAVAILABLE) from None
            if now >= next_log:
                log.warning("waiting for engine %s to answer (%s); %.0f s left", url,
                            exc.message, deadline - now)
                next_log = now + WAIT_LOG_EVERY_S
            sleep(RETRY_EVERY_S)


def check_usable(limits: ServerLimits, url: str) -> None:
    """Refuse a server whose answers carry no text: with --skip-tokenizer-init SGLang sends
    output ids only (tokenizer_manager.py `_handle_batch_output`, BatchTokenIDOutput)."""
    if limits.skip_tokenizer_init:
        raise StartupRefused(
            f"engine {url} runs with --skip-tokenizer-init, so its answers have no text "
            "(token ids only) and the worker writes text; restart it without that flag",
            exitcodes.CONFIG)


def share_of(total: int, share: tuple[int, int]) -> int:
    """Process I's part of `total` threads split as evenly as whole threads allow among N
    (the first total % N processes get one more), so the N processes hold `total` together;
    at least one each."""
    index, count = share
    return max(1, total // count + (1 if index <= total % count else 0))


def queue_reader(limits: ServerLimits, settings: WorkerSettings) -> LoadReader | None:
    """A reader of the engine's queue gauges (the servers' behind a router), if they can be
    read now; else None."""
    gauges = gauges_of(limits.engine)
    if gauges is None:
        return None
    url, key = settings.engine_url, settings.engine_api_key
    urls = sglang.servers_behind(url, api_key=key) if limits.servers_behind else [url]
    reader = LoadReader(urls, gauges, api_key=key)
    if reader.read() is None:
        reader.close()
        return None
    return reader


def plan_limit(proto: EngineProtocol, limits: ServerLimits, settings: WorkerSettings,
               reader: LoadReader | None) -> LimitPlan:
    """The in-flight limit without -c: the slots the server reports (K + 1, this process's
    share of them), else paced from its queue, else FALLBACK_LIMIT with a warning."""
    share = settings.share()
    size = None if limits.servers_behind else proto.pool_size(limits)
    bound = size is not None and _a_default_bound(limits, reader)
    if size and not bound:
        why = (f"{limits.engine} reports {limits.max_running_requests} running requests "
               f"({limits.running_requests_from}): K + 1 = {size}")
        if share[1] > 1:
            size = share_of(size, share)
            why += f", {size} for this process ({share[0]} of {share[1]})"
        return LimitPlan(pool=size, limit=size, source=why, slots=limits.max_running_requests)
    if reader is not None:
        ceiling = share_of(size, share) if size else settings.max_in_flight
        gauges = reader.gauges
        signals = gauges.waiting if gauges.generated is None else \
            f"{gauges.waiting}, and its token rate: {gauges.generated}"
        if limits.servers_behind:
            why = (f"the SGLang router in front of {limits.servers_behind} server(s): found "
                   f"from their queues ({signals}), shared with whichever workers use them")
        elif size:
            why = (f"{limits.engine} reports {limits.max_running_requests} running requests "
                   f"({limits.running_requests_from}), SGLang's own default "
                   f"({SGLANG_DEFAULT_SLOTS_LEAST} or more): a bound, found from its queue "
                   f"({signals}) up to {ceiling}")
        else:
            why = f"{limits.engine} reports no slot count: found from its queue ({signals})"
        start = min(START_LIMIT, ceiling)
        if share[1] > 1 and not limits.servers_behind:
            # The N processes on one engine start at START_LIMIT together, as one would: each
            # at 64 put 128 on a CPU vLLM at once, past where its rate peaks (bench real).
            start = share_of(start, share)
            why += f", starting at {start} for this process ({share[0]} of {share[1]})"
        return LimitPlan(pool=ceiling, limit=start, source=why, paced=True,
                         slots=limits.max_running_requests)
    if limits.servers_behind:
        raise StartupRefused(
            f"the engine is an SGLang router in front of {limits.servers_behind} server(s) whose "
            "queues cannot be read (start them with --enable-metrics): how many workers share "
            "them is not the router's to say; pass -c (their running requests / workers + 1)",
            exitcodes.CONFIG)
    return LimitPlan(pool=FALLBACK_LIMIT, limit=FALLBACK_LIMIT,
                     source=f"{limits.engine} reports neither its slot count nor its queue on "
                            f"/metrics: {FALLBACK_LIMIT}; pass -c to set it")


def _a_default_bound(limits: ServerLimits, reader: LoadReader | None) -> bool:
    """The reported slots are SGLang's own default (SGLANG_DEFAULT_SLOTS_LEAST) and the token
    rate can be read to pace below them."""
    return reader is not None and reader.gauges.generated is not None and \
        (limits.max_running_requests or 0) >= SGLANG_DEFAULT_SLOTS_LEAST


def fixed_plan(concurrency: int, limits: ServerLimits) -> LimitPlan:
    return LimitPlan(pool=concurrency, limit=concurrency, source=f"-c {concurrency}, as given",
                     slots=limits.max_running_requests)
