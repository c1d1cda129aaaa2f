"""The stream sink: an outcome and its bookkeeping go to Redis in one MULTI transaction."""

from __future__ import annotations

from typing import Any, Protocol

import orjson
import redis

from fleetgen.base.contract import KIND_FAILURE, KIND_RESULT, RunKeys, request_key
from fleetgen.base.outcomes import stream_entry

# The counters `status` shows per worker (fleetgen/monitor/status.py `_workers`); the others
# are kept for the run only. Every HINCRBY is a command in the MULTI of every outcome.
PER_WORKER = frozenset({"done", "failed", "completion_tokens"})


class Sink(Protocol):
    def is_done(self, run: str, line: int) -> bool: ...

    def emit(self, run: str, kind: str, line: int, record: dict[str, Any],
             stats: dict[str, int], payload: dict[str, Any] | None = None) -> None: ...


class StreamSink:
    """XADD + SETBIT done + counters, atomically: either the outcome exists and the row is
    marked done, or neither (a redelivered task then simply runs again)."""

    def __init__(self, client: redis.Redis, *, worker: str, wait_aof: bool = False) -> None:
        self._redis = client
        self._worker = worker
        self._wait_aof = wait_aof

    def is_done(self, run: str, line: int) -> bool:
        return bool(self._redis.getbit(RunKeys(run).done, line))

    def emit(self, run: str, kind: str, line: int, record: dict[str, Any],
             stats: dict[str, int], payload: dict[str, Any] | None = None) -> None:
        keys = RunKeys(run)
        pipe = self._redis.pipeline(transaction=True)
        pipe.xadd(keys.stream, stream_entry(kind, record))
        pipe.setbit(keys.done, line, 1)
        pipe.srem(keys.retrying, line)
        for name, value in stats.items():
            if not value:  # a counter that did not move costs no command
                continue
            pipe.hincrby(keys.stats, name, value)
            if name in PER_WORKER:
                pipe.hincrby(keys.stats, f"{self._worker}|{name}", value)
        if kind == KIND_FAILURE and payload is not None:
            # Kept so `fleetgen retry` can re-enqueue it without the input file.
            pipe.hset(keys.failed, request_key(record), orjson.dumps(payload))
        elif kind == KIND_RESULT:
            pipe.hdel(keys.failed, request_key(record))
        pipe.execute()
        if self._wait_aof:
            # The outcome is on disk before the task is acked (Redis >= 7.2 / Valkey 8).
            self._redis.execute_command("WAITAOF", 1, 0, 1000)
