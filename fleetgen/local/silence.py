"""The supervisor's reading of an engine that hangs while its health check passes: what its
workers' heartbeats say of it (`silent_s`, written by workers/gate.py from workers/silence.py),
and the rule that turns it into a restart.

The rule: an engine is stuck when every worker on it, alive and holding prompts, has had its
requests time out with no answer at all for `--engine-silent-s`, counted from the engine's
last start, and its probe still passes (a failing probe is the other rule). A saturated server
is never stuck by it: it answers late, and every answer ends its workers' silence."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import redis

from fleetgen.queue.contract import worker_key
from fleetgen.queue.heartbeat import Heartbeat
from fleetgen.queue.serverclock import ServerClock

log = logging.getLogger("fleetgen.engines")


def stuck_for_s(silences: Sequence[float], ready_for_s: float) -> float:
    """How long the engine has been stuck: the least silent of its workers (one that hears
    answers proves the engine alive), and never longer than it has been up since its last
    start (a silence begun before a restart is not the new engine's). 0 without workers."""
    return min([*silences, ready_for_s]) if silences else 0.0


class WorkerSilence:
    """Reads the `silent_s` of named workers' heartbeats on the run's Redis, shared by every
    engine's thread (a redis-py client is thread-safe). What it cannot read counts as no
    silence: a restart is never made on missing evidence."""

    def __init__(self, client: redis.Redis, workers_of: Callable[[int], list[str]]) -> None:
        self._client = client
        self._clock = ServerClock(client)
        self._workers_of = workers_of  # an engine's index -> its workers' names

    def silences(self, engine: int) -> list[float]:
        """`silent_s` of each of the engine's workers whose beat is fresh."""
        try:
            now = self._clock.now()
            with self._client.pipeline(transaction=False) as pipe:
                for name in self._workers_of(engine):
                    pipe.hgetall(worker_key(name))
                beats = pipe.execute()
        except redis.RedisError:
            log.debug("worker heartbeats not read", exc_info=True)
            return []
        return [_silent_s(beat) for beat in (_text(b) for b in beats)
                if beat and not Heartbeat.of(beat).lost(now)]


def _text(beat: dict[bytes | str, bytes | str]) -> dict[str, str]:
    return {_str(k): _str(v) for k, v in beat.items()}


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _silent_s(beat: dict[str, str]) -> float:
    try:
        return float(beat.get("silent_s", 0.0))
    except ValueError:
        return 0.0
