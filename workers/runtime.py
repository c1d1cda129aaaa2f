"""Per-process singletons of a worker: settings, the engine client, Redis and the sink."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from fleetgen import engine
from fleetgen.engine.decision import RetryPolicy
from fleetgen.engine.health import Watch
from fleetgen.errors import EngineError
from fleetgen.queue.redisconn import connect
from fleetgen.records.outcomes import Generation
from workers.pacing import Pace
from workers.settings import WorkerSettings
from workers.sink import StreamSink
from workers.state import state


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


def use_protocol(proto: engine.EngineProtocol) -> None:
    """The protocol resolved at start-up (FLEETGEN_ENGINE_PROTOCOL or detected)."""
    state.protocol = proto


def protocol(s: WorkerSettings) -> engine.EngineProtocol:
    """The start-up's choice; when the engine was not up then (-c given), resolved now: the
    health gate lets no task run before the engine has answered."""
    if state.protocol is None:
        state.protocol = engine.resolve(s.engine_protocol, s.engine_url, s.engine_api_key)
    proto: engine.EngineProtocol = state.protocol
    return proto


def configure(worker_name: str, concurrency: int) -> None:
    """Called at worker start, before any task, with Celery's node name and pool size."""
    state.worker_name, state.concurrency = worker_name, concurrency


@contextmanager
def in_flight() -> Iterator[None]:
    """Counts the prompts this process is working on. Kept in memory and published with the
    heartbeat (no Redis write per prompt), so a killed worker cannot leave a stale count: its
    heartbeat key simply expires."""
    with state.lock:
        state.inflight += 1
    try:
        yield
    finally:
        with state.lock:
            state.inflight -= 1


def in_flight_count() -> int:
    return state.inflight


def concurrency() -> int:
    """The pool's size (the ceiling of the in-flight limit)."""
    return state.concurrency


def pace() -> Pace | None:
    """The in-flight limit in force and its source; None when -c was given before the engine
    answered (the pool is the limit)."""
    return None if state.pacing is None else state.pacing.current


def settings() -> WorkerSettings:
    """The worker's settings, read from the environment once per process: first by the
    Celery app at import (a bad one is exit 3 before Celery starts), then shared by `get`."""
    if state.settings is None:
        state.settings = WorkerSettings.from_env()
    read: WorkerSettings = state.settings
    return read


def get() -> Runtime:
    """Built on first use and then shared by every pool thread of the process."""
    built: Runtime | None = state.runtime
    if built is not None:  # every task calls this: no lock once it is built
        return built
    with state.lock:
        if state.runtime is None:
            s = settings()
            client = connect(s.redis_url, ping=False)  # a worker rides out a Redis restart
            name = state.worker_name
            state.runtime = Runtime(
                settings=s,
                engine=LazyEngine(s, state.concurrency),
                redis=client,
                sink=StreamSink(client, worker=name, wait_aof=s.wait_aof),
                policy=RetryPolicy.of(s),
                worker=name,
                watch=Watch(s.engine_url, interval_s=s.health_interval_s,
                            gone_after_s=s.engine_gone_s, api_key=s.engine_api_key),
            )
        made: Runtime = state.runtime
        return made
