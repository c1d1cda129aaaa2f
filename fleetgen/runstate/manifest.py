"""The run's manifest in Redis, its one owner: its fields as a type, and the verbs that read
and write it. Nothing else knows the names under which the fields are stored.

The manifest is a hash (`RunKeys.manifest`, no TTL: a run may be resumed days later). The
producer starts it, records how far it has read, closes it with the run's total (or stops it
early, `--stop-if`); the drainer adds the time the run stood still and pins when it ended;
`fleetgen retry` and a resume clear that end again. Stored names never change: a run started
by an older fleetgen must resume.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
import redis

from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import run_keys, runs_index_key

# The hash's fields, as stored.
SETTINGS: Final = "settings"  # JSON: fleetgen/settings/runoptions.py STORED, and `files`
STATE: Final = "state"  # producing | produced | stopped (the STATE_ values below)
STARTED_AT: Final = "started_at"
READ: Final = "read"  # requests read so far
EXPECTED: Final = "expected"  # the total, as `reassert` writes it back into a lost manifest
TOTAL: Final = "total"  # the run's requests, once the producer has read all of the input
PRODUCED_AT: Final = "produced_at"
INPUT_BYTES: Final = "input_bytes"  # the input's size when produced: a grown input is read again
INPUT_ROWS: Final = "input_rows"  # its rows (JSONL lines, Parquet rows): `total` counts requests
STOP_REASON: Final = "stop_reason"
STOPPED_AT: Final = "stopped_at"
PAUSED_S: Final = "paused_s"  # the time a resumed run stood still, not in its wall time
# When the run ended (complete, or stopped and settled), pinned by the drainer as it writes the
# summary, so `status`'s elapsed and every later summary.json agree; cleared by whatever sets
# the run going again (a resume, `fleetgen retry`).
FINISHED_AT: Final = "finished_at"

# The states, in STATE: producing -> produced. `retrying` while `fleetgen retry` re-enqueues
# failures.
STATE_PRODUCING: Final = "producing"
STATE_PRODUCED: Final = "produced"
# `--stop-if` saw the first answers break a rule: nothing more is enqueued (STOP_REASON says
# why) until the producer is run again with --ignore-stop.
STATE_STOPPED: Final = "stopped"
# Not a manifest state but what `status` shows of a produced run that `run_complete` holds.
STATE_COMPLETE: Final = "complete"

STOPPED_BY_DEFAULT: Final = "stopped by --stop-if"


def _number(raw: str | None) -> float | None:
    return float(raw) if raw not in (None, "") else None


def _count(raw: str | None) -> int | None:
    return int(raw) if raw not in (None, "") else None


@dataclass(frozen=True)
class Manifest:
    """One read of a run's manifest. `exists` is False for a run Redis does not know."""

    exists: bool = False
    settings: dict[str, Any] | None = None  # None: no settings stored (lost, or no run)
    state: str | None = None
    started_at: float | None = None
    read: int = 0
    expected: int | None = None
    total: int | None = None
    produced_at: float | None = None
    input_bytes: int | None = None
    input_rows: int | None = None
    stop_reason: str | None = None
    stopped_at: float | None = None
    paused_s: float = 0.0
    finished_at: float | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> Manifest:
        try:
            settings = orjson.loads(raw[SETTINGS]) if SETTINGS in raw else None
        except orjson.JSONDecodeError:
            settings = None
        return cls(exists=bool(raw), settings=settings, state=raw.get(STATE),
                   started_at=_number(raw.get(STARTED_AT)), read=_count(raw.get(READ)) or 0,
                   expected=_count(raw.get(EXPECTED)), total=_count(raw.get(TOTAL)),
                   produced_at=_number(raw.get(PRODUCED_AT)),
                   input_bytes=_count(raw.get(INPUT_BYTES)),
                   input_rows=_count(raw.get(INPUT_ROWS)), stop_reason=raw.get(STOP_REASON),
                   stopped_at=_number(raw.get(STOPPED_AT)),
                   paused_s=_number(raw.get(PAUSED_S)) or 0.0,
                   finished_at=_number(raw.get(FINISHED_AT)) or None)

    @property
    def rows(self) -> int | None:
        """The run's requests: the total once all is read, else the count made before (None:
        not known)."""
        return self.total or self.expected or None

    @property
    def produced(self) -> bool:
        """The producer has read the whole input: the total is known."""
        return self.state == STATE_PRODUCED and self.total is not None

    @property
    def stopped(self) -> str | None:
        """Why `--stop-if` stopped the run, while it stands stopped."""
        if self.state != STATE_STOPPED:
            return None
        return self.stop_reason or STOPPED_BY_DEFAULT

    @property
    def pinned(self) -> dict[str, Any]:
        """The settings the run was started with ({} when none are stored)."""
        return self.settings or {}


class RunManifest:
    """The verbs on one run's manifest."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        self.redis = client
        self.run = run
        self.key = run_keys(run).manifest

    def read(self) -> Manifest:
        return Manifest.parse(self.raw())

    def raw(self) -> dict[str, str]:
        """The hash as stored (for tests and a look by hand)."""
        return read_hash(self.redis, self.key)

    def exists(self) -> bool:
        return bool(self.redis.exists(self.key))

    # -- the producer ------------------------------------------------------------------------
    def start(self, settings: Mapping[str, Any]) -> None:
        """A new run: its settings and its name in the runs index (its total is known once
        the producer has read all of the input)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key, mapping={
            SETTINGS: orjson.dumps(dict(settings)), STATE: STATE_PRODUCING,
            STARTED_AT: time.time(), READ: 0})
        pipe.sadd(runs_index_key(), self.run)
        pipe.execute()

    def resume(self) -> None:
        """The run goes on: producing again, neither stopped nor ended (the drainer pins the
        end again)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key, STATE, STATE_PRODUCING)
        pipe.hdel(self.key, STOP_REASON, FINISHED_AT)
        pipe.execute()

    def record_read(self, requests: int) -> None:
        self.redis.hset(self.key, READ, requests)

    def close(self, total: int, input_bytes: int | None = None,
              input_rows: int | None = None) -> None:
        """Every row has been read: the run's total is known (and the input's size then, and
        its rows, which samples and turns make fewer than the requests)."""
        mapping: dict[Any, Any] = {STATE: STATE_PRODUCED, TOTAL: total, READ: total,
                                   PRODUCED_AT: time.time()}
        if input_bytes is not None:
            mapping[INPUT_BYTES] = input_bytes
        if input_rows is not None:
            mapping[INPUT_ROWS] = input_rows
        self.redis.hset(self.key, mapping=mapping)

    def stop(self, reason: str) -> None:
        self.redis.hset(self.key, mapping={STATE: STATE_STOPPED, STOP_REASON: reason,
                                           STOPPED_AT: time.time()})

    def reassert(self, settings: Mapping[str, Any], total: int) -> bool:
        """Write the total and the state again if Redis forgot them (restarted from a copy
        taken before the producer finished reading, or before the run existed): without
        them no one can call the run complete. Returns True if anything was missing."""
        old = self.read()
        if old.state == STATE_PRODUCED and old.total == total:
            return False
        mapping: dict[Any, Any] = {STATE: STATE_PRODUCED, TOTAL: total, READ: total,
                                   PRODUCED_AT: time.time()}
        if old.settings is None:  # the whole manifest is gone: the pins come back too
            mapping.update({SETTINGS: orjson.dumps(dict(settings)), STARTED_AT: time.time(),
                            EXPECTED: total})
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key, mapping=mapping)
        pipe.sadd(runs_index_key(), self.run)
        pipe.execute()
        return True

    # -- the drainer, `fleetgen retry` -------------------------------------------------------
    def carry_clock(self, started_at: float, paused_s: float) -> None:
        """A finished run set going again after its Redis state was deleted (its files'
        summary.json holds its clock): it started then, and stood still since it ended, so its
        wall time counts the work that made every row in the files."""
        self.redis.hset(self.key, mapping={STARTED_AT: started_at,
                                           PAUSED_S: round(max(paused_s, 0.0), 3)})

    def add_pause(self, seconds: float) -> None:
        """The run stood still this long before a drainer started on it again."""
        self.redis.hincrbyfloat(self.key, PAUSED_S, round(seconds, 3))

    def pin_finished(self, at: float) -> None:
        """The run has ended (complete, or stopped and settled): when, once for everyone."""
        self.redis.hset(self.key, FINISHED_AT, at)

    def reopen(self, pipe: Any) -> None:
        """In `pipe` (a transaction of the caller's): the run has not ended any more."""
        pipe.hdel(self.key, FINISHED_AT)
