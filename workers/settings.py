"""Worker settings: one frozen dataclass built from FLEETGEN_* environment variables.

Each field names its variable (fleetgen/settings/envvars.py), which gives its default, its parsing
and whether it is a secret; `from_env` reads them all from that one mapping."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from fleetgen import engine
from fleetgen.errors import ConfigError
from fleetgen.queue.redisconn import redis_url
from fleetgen.settings import envvars as ev

T = TypeVar("T")
ENV = "env"  # the field metadata that names a field's variable
# Heartbeats per visibility timeout, at least.
LEASE_BEATS = 5


def _setting(var: ev.EnvVar[T], *, required: bool = False) -> Any:
    """A field read from `var`: its default (unless `required`), hidden from repr if secret."""
    meta = {ENV: var}
    if required:
        return field(repr=not var.secret, metadata=meta)
    return field(default=var.default, repr=not var.secret, metadata=meta)


@dataclass(frozen=True)
class WorkerSettings:
    redis_url: str = _setting(ev.REDIS_URL, required=True)
    engine_url: str = _setting(ev.ENGINE_URL, required=True)
    engine_api_key: str | None = _setting(ev.ENGINE_API_KEY)
    # sglang | openai; None: detected from what the engine answers at start-up.
    engine_protocol: str | None = _setting(ev.ENGINE_PROTOCOL)
    visibility_timeout_s: float = _setting(ev.VISIBILITY_TIMEOUT_S)
    request_timeout_s: float = _setting(ev.REQUEST_TIMEOUT_S)
    max_attempts: int = _setting(ev.MAX_ATTEMPTS)
    backoff_base_s: float = _setting(ev.BACKOFF_BASE_S)
    backoff_cap_s: float = _setting(ev.BACKOFF_CAP_S)
    health_interval_s: float = _setting(ev.HEALTH_INTERVAL_S)
    # Refused or not ready without a break for this long = the engine is gone: the worker
    # stops taking prompts and hands back what it holds. Shorter outages are ridden out.
    engine_gone_s: float = _setting(ev.ENGINE_GONE_S)
    # How long a worker started without -c waits for its engine to answer at start-up
    # (SGLang keeps its port closed while it loads weights) before exiting with code 4.
    engine_wait_s: float = _setting(ev.ENGINE_WAIT_S)
    wait_aof: bool = _setting(ev.WAIT_AOF)
    # A worker stopped with SIGTERM finishes its prompts for this long, then hands back to the
    # queue whatever is still running and exits (workers/handback.py).
    handback_s: float = _setting(ev.HANDBACK_S)
    # Celery's two INFO lines per task ("Task ... received", "... succeeded in ..."): off by
    # default, as a successful prompt needs no line (failures and retries log their own,
    # with the prompt id); FLEETGEN_TASK_LOG=1 brings them back at `-l INFO`.
    task_log: bool = _setting(ev.TASK_LOG)
    # "I/N": the I-th of N worker processes that share one engine (one process's delivery
    # loop tops out at a few hundred prompts a second; a small model's GPU can take more).
    engine_share: str | None = _setting(ev.ENGINE_SHARE)
    # The ceiling of a paced worker's in-flight limit (workers/pacing.py) and its pool's size:
    # threads are made as the limit grows, so a high ceiling costs nothing until it is used.
    max_in_flight: int = _setting(ev.MAX_IN_FLIGHT)

    def __post_init__(self) -> None:
        if not self.engine_url.startswith(("http://", "https://")):
            raise ConfigError(f"{ev.ENGINE_URL.name} must be an http(s) URL, "
                              f"got {self.engine_url!r}")
        if self.engine_protocol is not None:
            engine.protocol(self.engine_protocol)  # ConfigError naming the known ones
        for var, value in ((ev.HEALTH_INTERVAL_S, self.health_interval_s),
                           (ev.ENGINE_GONE_S, self.engine_gone_s),
                           (ev.ENGINE_WAIT_S, self.engine_wait_s),
                           (ev.HANDBACK_S, self.handback_s)):
            if value <= 0:
                raise ConfigError(f"{var.name} must be > 0, got {value:g}")
        self.share()  # a malformed share is a ConfigError at start
        if self.max_in_flight < 1:
            raise ConfigError(f"{ev.MAX_IN_FLIGHT.name} must be >= 1, got {self.max_in_flight}")
        if self.max_attempts < 1:
            raise ConfigError(f"{ev.MAX_ATTEMPTS.name} must be >= 1, got {self.max_attempts}")
        # The lease is renewed at every heartbeat: a few late beats must not let it lapse
        # under a live worker (a lapse costs a second generation, not a second answer).
        if self.visibility_timeout_s < LEASE_BEATS * self.health_interval_s:
            raise ConfigError(
                f"{ev.VISIBILITY_TIMEOUT_S.name} ({self.visibility_timeout_s:g}) must be at least "
                f"{LEASE_BEATS} x {ev.HEALTH_INTERVAL_S.name} ({self.health_interval_s:g}): it "
                "is the lease each heartbeat renews")
        # A stopping worker beats no more (its consumer, the health gate's timer, stops first)
        # while it finishes what it holds: it must hand the rest back before the leases lapse.
        if self.handback_s >= self.visibility_timeout_s:
            raise ConfigError(
                f"{ev.HANDBACK_S.name} ({self.handback_s:g}) must be less than "
                f"{ev.VISIBILITY_TIMEOUT_S.name} ({self.visibility_timeout_s:g}): a stopping "
                "worker no longer renews its leases")

    def share(self) -> tuple[int, int]:
        """(I, N) of FLEETGEN_ENGINE_SHARE, 1-based; (1, 1) when unset."""
        if self.engine_share is None:
            return 1, 1
        index, sep, count = self.engine_share.partition("/")
        if sep and index.strip().isdigit() and count.strip().isdigit():
            i, n = int(index), int(count)
            if 1 <= i <= n:
                return i, n
        raise ConfigError(f"{ev.ENGINE_SHARE.name} must be I/N with 1 <= I <= N (this "
                          f"process's number among N sharing the engine), got "
                          f"{self.engine_share!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSettings:
        env = dict(os.environ if env is None else env)
        values = {f.name: f.metadata[ENV].value(env) for f in fields(cls)}
        # --redis has no worker flag; the URL is checked (and defaulted) as every command's.
        values["redis_url"] = redis_url(env.get(ev.REDIS_URL.name))
        return cls(**values)
