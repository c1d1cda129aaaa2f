"""The stream sink: an outcome and its bookkeeping go to Redis in one atomic Lua script."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson
import redis

from fleetgen.queue.contract import KIND_FAILURE, KIND_RESULT, request_key
from fleetgen.records.outcomes import stream_entry
from fleetgen.runstate.keys import run_keys

log = logging.getLogger("fleetgen.worker")

# Between two tries of an outcome's write while Valkey is out of reach (past the client's own
# retries, about 100 s).
REWRITE_EVERY_S = 2.0

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

    def __init__(self, client: redis.Redis, *, worker: str, wait_aof: bool = False,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._redis = client
        self._worker = worker
        self._wait_aof = wait_aof
        self._emit = client.register_script(_EMIT_IF_RUN_EXISTS)
        self._sleep = sleep

    def is_done(self, run: str, slot: int) -> bool:
        """Raises RunPurged for a run without a manifest: one round trip for both reads."""
        keys = run_keys(run)
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
        keys = run_keys(run)
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
        written = self._write(keys=[keys.manifest, keys.done], args=args, row=record.get("id"))
        if not written:
            raise RunPurged(run)
        if written == 2:
            return False
        if self._wait_aof:
            # The outcome is on disk before the task is acked (Redis >= 7.2 / Valkey 8).
            self._redis.execute_command("WAITAOF", 1, 0, 1000)
        return True

    def _write(self, *, keys: list[str], args: list[Any], row: Any) -> Any:
        """The outcome's script, tried again until Valkey answers (issue 52): the answer is
        the only copy of a generation, and a write given up failed the task, whose ack on
        failure then removed the message: the row was nowhere, for a waiting producer alone
        to find. The script is idempotent (a done bit already set refuses a second write)."""
        since = None
        while True:
            try:
                written = self._emit(keys=keys, args=args)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if since is None:
                    since = time.monotonic()
                    log.warning("id=%s answered, but Valkey is out of reach (%s): its outcome "
                                "is kept and written once Valkey answers", row, exc)
                self._sleep(REWRITE_EVERY_S)
                continue
            if since is not None:
                log.warning("id=%s outcome written after %.0f s without Valkey", row,
                            time.monotonic() - since)
            return written
