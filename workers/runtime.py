"""Per-process singletons of a worker: settings, the engine client, Redis and the sink."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from fleetgen import engine
from fleetgen.base.errors import EngineError
from fleetgen.base.outcomes import Generation
from fleetgen.base.redisconn import connect
from fleetgen.engine.health import Watch
from workers.generate import RetryPolicy
from workers.settings import WorkerSettings
from workers.sink import StreamSink


@dataclass
class Runtime:
    settings: WorkerSettings
    engine: engine.Engine
    redis: redis.Redis
    sink: StreamSink
    policy: RetryPolicy
    worker: str
    watch: Watch  # the one readiness prober of this process (started by the health gate)


class LazyEngine:
    """The engine client, built on first use. A worker started with -c beside a server that
    is not up yet cannot know its protocol (it is detected from the server's answers), and the
    health gate lets no prompt through before the server has answered."""

    def __init__(self, s: WorkerSettings, concurrency: int) -> None:
        self.base_url = s.engine_url
        self._settings = s
        self._concurrency = concurrency
        self._client: engine.Engine | None = None
        self._lock = threading.Lock()

    def _get(self) -> engine.Engine:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    s = self._settings
                    self._client = protocol(s).connect(
                        s.engine_url, timeout_s=s.request_timeout_s,
                        concurrency=self._concurrency, api_key=s.engine_api_key)
        return self._client

    @property
    def rule(self) -> engine.LengthRule:
        return self._get().rule

    def generate(self, input_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any], rid: str,
                 options: engine.GenerateOptions = engine.PLAIN) -> Generation:
        return self._get().generate(input_ids, max_new_tokens, sampling, rid, options)

    def healthy(self) -> bool:
        try:
            return self._get().healthy()
        except EngineError:
            return False

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


# The pool size until Celery reports its own (configure): the engine client's pool limits.
DEFAULT_CONCURRENCY = 16

_lock = threading.Lock()
_runtime: Runtime | None = None
_settings: WorkerSettings | None = None
_worker_name = f"worker@{socket.gethostname()}"
_concurrency = DEFAULT_CONCURRENCY


_protocol: engine.EngineProtocol | None = None


def use_protocol(proto: engine.EngineProtocol) -> None:
    """The protocol resolved at start-up (FLEETGEN_ENGINE_PROTOCOL or detected)."""
    global _protocol
    _protocol = proto


def protocol(s: WorkerSettings) -> engine.EngineProtocol:
    """The start-up's choice; when the engine was not up then (-c given), resolved now: the
    health gate lets no task run before the engine has answered."""
    global _protocol
    if _protocol is None:
        _protocol = engine.resolve(s.engine_protocol, s.engine_url, s.engine_api_key)
    return _protocol


def configure(worker_name: str, concurrency: int) -> None:
    """Called at worker start, before any task, with Celery's node name and pool size."""
    global _worker_name, _concurrency
    _worker_name, _concurrency = worker_name, concurrency


_inflight = 0
_inflight_lock = threading.Lock()


@contextmanager
def in_flight() -> Iterator[None]:
    """Counts the prompts this process is working on. Kept in memory and published with the
    heartbeat (no Redis write per prompt), so a killed worker cannot leave a stale count: its
    heartbeat key simply expires."""
    global _inflight
    with _inflight_lock:
        _inflight += 1
    try:
        yield
    finally:
        with _inflight_lock:
            _inflight -= 1


def in_flight_count() -> int:
    return _inflight


def concurrency() -> int:
    return _concurrency


def settings() -> WorkerSettings:
    """The worker's settings, read from the environment once per process: first by the
    Celery app at import (a bad one is exit 3 before Celery starts), then shared by `get`."""
    global _settings
    if _settings is None:
        _settings = WorkerSettings.from_env()
    return _settings


def get() -> Runtime:
    """Built on first use and then shared by every pool thread of the process."""
    global _runtime
    if _runtime is not None:  # every task calls this: no lock once it is built
        return _runtime
    with _lock:
        if _runtime is None:
            s = settings()
            client = connect(s.redis_url, ping=False)  # a worker rides out a Redis restart
            _runtime = Runtime(
                settings=s,
                engine=LazyEngine(s, _concurrency),
                redis=client,
                sink=StreamSink(client, worker=_worker_name, wait_aof=s.wait_aof),
                policy=RetryPolicy.of(s),
                worker=_worker_name,
                watch=Watch(s.engine_url, interval_s=s.health_interval_s,
                            gone_after_s=s.engine_gone_s, api_key=s.engine_api_key),
            )
        return _runtime
