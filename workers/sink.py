"""The stream sink: an outcome and its bookkeeping go to Redis in one atomic Lua script."""

from __future__ import annotations

from typing import Any, Protocol

import orjson
import redis

from fleetgen.base.contract import KIND_FAILURE, KIND_RESULT, RunKeys, request_key
from fleetgen.base.outcomes import stream_entry

# The counters `status` shows per worker (fleetgen/monitor/status.py `_workers`); the others
# are kept for the run only. Every HINCRBY is a command in every outcome's script.
PER_WORKER = frozenset({"done", "failed", "completion_tokens"})


class RunPurged(Exception):
    """The run's manifest is gone (`fleetgen purge`): its tasks are dropped, never generated,
    and nothing of the run is written back."""


class Sink(Protocol):
    def is_done(self, run: str, slot: int) -> bool: ...

    def emit(self, run: str, kind: str, slot: int, record: dict[str, Any],
             stats: dict[str, int], payload: dict[str, Any] | None = None) -> bool: ...


# The outcome's commands, run only while the run's manifest (KEYS[1]) exists: a run purged
# while its prompt ran would otherwise get its keys back (a stream, a done bit, counters that
# no command can see or remove); and only while the row's done bit (KEYS[2], ARGV[1]) is
# clear: a worker whose lease lapsed while it was frozen finishes a prompt that another worker
# has since answered, and its late answer must not be a second outcome (nor count twice).
# `fleetgen retry` clears the bit of a row it sends back. A script, not a MULTI, so the checks
# and the writes are one atomic step in one round trip. ARGV[2..]: for each command, its word
# count, then its words.
_EMIT_IF_RUN_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('GETBIT', KEYS[2], ARGV[1]) == 1 then return 2 end
local i = 2
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return 1
"""

Command = tuple[Any, ...]


class StreamSink:
    """XADD + SETBIT done + counters, atomically: either the outcome exists and the row is
    marked done, or neither (a redelivered task then simply runs again)."""

    def __init__(self, client: redis.Redis, *, worker: str, wait_aof: bool = False) -> None:
        self._redis = client
        self._worker = worker
        self._wait_aof = wait_aof
        self._emit = client.register_script(_EMIT_IF_RUN_EXISTS)

    def is_done(self, run: str, slot: int) -> bool:
        """Raises RunPurged for a run without a manifest: one round trip for both reads."""
        keys = RunKeys(run)
        pipe = self._redis.pipeline(transaction=False)
        pipe.getbit(keys.done, slot)
        pipe.exists(keys.manifest)
        done, known = pipe.execute()
        if not known:
            raise RunPurged(run)
        return bool(done)

    def emit(self, run: str, kind: str, slot: int, record: dict[str, Any],
             stats: dict[str, int], payload: dict[str, Any] | None = None) -> bool:
        """False if the row already has an outcome (nothing written); RunPurged if the run
        is gone."""
        keys = RunKeys(run)
        entry = stream_entry(kind, record)
        commands: list[Command] = [
            ("XADD", keys.stream, "*", *(w for kv in entry.items() for w in kv)),
            ("SETBIT", keys.done, slot, 1),
            ("SREM", keys.retrying, slot),
        ]
        for name, value in stats.items():
            if not value:  # a counter that did not move costs no command
                continue
            commands.append(("HINCRBY", keys.stats, name, value))
            if name in PER_WORKER:
                commands.append(("HINCRBY", keys.stats, f"{self._worker}|{name}", value))
        if kind == KIND_FAILURE and payload is not None:
            # Kept so `fleetgen retry` can re-enqueue it without the input file.
            commands.append(("HSET", keys.failed, request_key(record), orjson.dumps(payload)))
        elif kind == KIND_RESULT:
            commands.append(("HDEL", keys.failed, request_key(record)))
        args = [slot, *(word for command in commands for word in (len(command), *command))]
        written = self._emit(keys=[keys.manifest, keys.done], args=args)
        if not written:
            raise RunPurged(run)
        if written == 2:
            return False
        if self._wait_aof:
            # The outcome is on disk before the task is acked (Redis >= 7.2 / Valkey 8).
            self._redis.execute_command("WAITAOF", 1, 0, 1000)
        return True
