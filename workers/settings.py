"""Worker settings: one frozen dataclass built from FLEETGEN_* environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fleetgen import engine
from fleetgen.base.celeryconf import DEFAULT_VISIBILITY_TIMEOUT_S
from fleetgen.base.errors import ConfigError
from fleetgen.base.redisconn import redis_url


@dataclass(frozen=True)
class WorkerSettings:
    redis_url: str = field(repr=False)
    engine_url: str
    engine_api_key: str | None = field(default=None, repr=False)
    # sglang | openai; None: detected from what the engine answers at start-up.
    engine_protocol: str | None = None
    visibility_timeout_s: float = DEFAULT_VISIBILITY_TIMEOUT_S
    request_timeout_s: float = 900.0
    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 30.0
    health_interval_s: float = 2.0
    # Refused or not ready without a break for this long = the engine is gone: the worker
    # stops taking prompts and hands back what it holds. Shorter outages are ridden out.
    engine_gone_s: float = 10.0
    # How long a worker started without -c waits for its engine to answer at start-up
    # (SGLang keeps its port closed while it loads weights) before exiting with code 4.
    engine_wait_s: float = 600.0
    wait_aof: bool = False
    # A worker stopped with SIGTERM finishes its prompts for this long, then hands back to the
    # queue whatever is still running and exits (workers/handback.py).
    handback_s: float = 30.0
    # Celery's two INFO lines per task ("Task ... received", "... succeeded in ..."): off by
    # default, as a successful prompt needs no line (failures and retries log their own,
    # with the prompt id); FLEETGEN_TASK_LOG=1 brings them back at `-l INFO`.
    task_log: bool = False

    def __post_init__(self) -> None:
        if not self.engine_url.startswith(("http://", "https://")):
            raise ConfigError("FLEETGEN_ENGINE_URL must be an http(s) URL, "
                              f"got {self.engine_url!r}")
        if self.engine_protocol is not None:
            engine.protocol(self.engine_protocol)  # ConfigError naming the known ones
        for name in ("health_interval_s", "engine_gone_s", "engine_wait_s", "handback_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"FLEETGEN_{name.upper()} must be > 0, "
                                  f"got {getattr(self, name):g}")
        if self.max_attempts < 1:
            raise ConfigError(f"FLEETGEN_MAX_ATTEMPTS must be >= 1, got {self.max_attempts}")
        if self.visibility_timeout_s <= self.request_timeout_s:
            raise ConfigError(
                f"FLEETGEN_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s:g}) must exceed "
                f"FLEETGEN_REQUEST_TIMEOUT_S ({self.request_timeout_s:g}), or every slow "
                "prompt would be delivered twice")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WorkerSettings:
        env = dict(os.environ if env is None else env)
        return cls(
            redis_url=redis_url(env.get("FLEETGEN_REDIS_URL")),
            engine_url=env.get("FLEETGEN_ENGINE_URL", "http://127.0.0.1:30000"),
            engine_api_key=env.get("FLEETGEN_ENGINE_API_KEY") or None,
            engine_protocol=env.get("FLEETGEN_ENGINE_PROTOCOL") or None,
            visibility_timeout_s=_num(env, "FLEETGEN_VISIBILITY_TIMEOUT_S",
                                      DEFAULT_VISIBILITY_TIMEOUT_S),
            request_timeout_s=_num(env, "FLEETGEN_REQUEST_TIMEOUT_S", 900.0),
            max_attempts=int(_num(env, "FLEETGEN_MAX_ATTEMPTS", 5)),
            backoff_base_s=_num(env, "FLEETGEN_BACKOFF_BASE_S", 1.0),
            backoff_cap_s=_num(env, "FLEETGEN_BACKOFF_CAP_S", 30.0),
            health_interval_s=_num(env, "FLEETGEN_HEALTH_INTERVAL_S", 2.0),
            engine_gone_s=_num(env, "FLEETGEN_ENGINE_GONE_S", 10.0),
            engine_wait_s=_num(env, "FLEETGEN_ENGINE_WAIT_S", 600.0),
            wait_aof=env.get("FLEETGEN_WAIT_AOF", "0").lower() in ("1", "true", "yes"),
            handback_s=_num(env, "FLEETGEN_HANDBACK_S", 30.0),
            task_log=env.get("FLEETGEN_TASK_LOG", "0").lower() in ("1", "true", "yes"),
        )


def _num(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return float(default)
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
