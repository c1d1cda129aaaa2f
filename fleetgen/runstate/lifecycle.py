"""Run state in Redis: the one definition of a complete run, and the key operations that
`retry` and `purge` perform on a run (a cache of progress; the output files are the truth)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import orjson
import redis

from fleetgen.queue.contract import TaskPayload
from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import run_keys, runs_index_key
from fleetgen.runstate.manifest import Manifest, RunManifest


def run_complete(client: redis.Redis, run: str, written: int | None = None,
                 manifest: Manifest | None = None) -> bool:
    """The one definition of a finished run: the producer has read the whole input, every
    row is written, no row is back in retry, and the stream holds nothing unwritten.
    `written` is the drainer's own count when it asks; others read the count it publishes.
    `manifest`: the run's manifest if the caller has just read it (one read per tick)."""
    keys = run_keys(run)
    manifest = RunManifest(client, run).read() if manifest is None else manifest
    if not manifest.produced or manifest.total is None:
        return False
    if written is None:
        counts = read_hash(client, keys.written)
        # `blocked`: later turns held back by a failed turn (--turns all), settled for now.
        written = sum(int(counts.get(k, 0)) for k in ("done", "failed", "rejected", "blocked"))
    if written < manifest.total:
        return False
    # Rows that `fleetgen retry` sent back to work are not final until they land again, and
    # an entry XADDed just after the drainer's last read is still in the stream.
    pipe = client.pipeline(transaction=False)
    pipe.scard(keys.retrying)
    pipe.xlen(keys.stream)
    retrying, unread = pipe.execute()
    return retrying == 0 and unread == 0


def stopped_and_settled(client: redis.Redis, run: str, written: int,
                        manifest: Manifest | None = None) -> str | None:
    """The reason, if `--stop-if` stopped the run and every request sent before the stop has
    been written (so a drainer can end with what there is); else None."""
    keys = run_keys(run)
    manifest = RunManifest(client, run).read() if manifest is None else manifest
    if manifest.stopped is None:
        return None
    pipe = client.pipeline(transaction=False)
    pipe.bitcount(keys.sent)
    pipe.scard(keys.retrying)
    pipe.xlen(keys.stream)
    sent, retrying, unread = pipe.execute()
    if written < sent or retrying or unread:
        return None
    return manifest.stopped


def exists(client: redis.Redis, run: str) -> bool:
    return RunManifest(client, run).exists()


def failed_payloads(client: redis.Redis, run: str) -> list[TaskPayload]:
    """The task payloads of the run's failed rows, kept by the workers for `fleetgen retry`."""
    return [cast(TaskPayload, orjson.loads(v)) for v in client.hvals(run_keys(run).failed)]


def mark_retrying(client: redis.Redis, run: str, lines: Iterable[int]) -> None:
    """Send rows back to work: clear their done bits and list them as in retry, so the run is
    not complete until each lands again (a worker removes its line when it records it)."""
    keys = run_keys(run)
    pipe = client.pipeline(transaction=True)
    for line in lines:
        pipe.sadd(keys.retrying, line)
        pipe.setbit(keys.done, line, 0)
    RunManifest(client, run).reopen(pipe)  # not ended any more: the drainer pins it again
    pipe.execute()


def purge(client: redis.Redis, run: str) -> int:
    """Delete every key of the run and its entry in the runs index; returns keys deleted."""
    keys = run_keys(run)
    pipe = client.pipeline(transaction=True)
    pipe.delete(*keys.all())
    pipe.srem(runs_index_key(), run)
    return int(pipe.execute()[0])
