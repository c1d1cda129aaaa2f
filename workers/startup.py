"""A worker's start-up against its engine: wait for it to answer, refuse one whose answers it
cannot use, and size the thread pool from the running requests it has in force."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from fleetgen import engine
from fleetgen.base import exitcodes
from fleetgen.base.errors import ConfigError, EngineError, PermanentError
from fleetgen.engine import EngineProtocol, ServerLimits
from workers.settings import WorkerSettings

log = logging.getLogger("fleetgen.worker")

WAIT_LOG_EVERY_S = 30.0
RETRY_EVERY_S = 1.0


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


def pool_size(proto: EngineProtocol, limits: ServerLimits,
              share: tuple[int, int] = (1, 1)) -> tuple[int | None, str]:
    """The thread count the protocol suggests (this process's share of it, when N processes
    share the engine: FLEETGEN_ENGINE_SHARE) and the log line that says why."""
    size = proto.pool_size(limits)
    if limits.servers_behind:
        total = limits.max_running_requests
        example = f"-c {total + 1} for the only worker, about {total}/W + 1 each for W" \
            if total else "the servers' running requests + 1, shared among the workers"
        raise StartupRefused(
            f"the engine is an SGLang router in front of {limits.servers_behind} server(s) "
            f"running {total or 'an unknown number of'} requests at once in all; how many "
            f"workers share them is not the router's to say: pass -c ({example})",
            exitcodes.CONFIG)
    if not size:
        return None, (f"{limits.engine} does not report how many requests it runs at once; "
                      "keeping Celery's default pool: pass -c (vLLM: its --max-num-seqs + 1)")
    why = (f"pool sized from the engine: {limits.max_running_requests} running requests "
           f"in force ({limits.running_requests_from}, dp {limits.dp_size}) -> -c {size}")
    if share[1] > 1:
        mine = share_of(size, share)
        return mine, f"{why}, shared by {share[1]} processes: this one ({share[0]}/{share[1]}) " \
                     f"-c {mine}"
    return size, why
