"""The Redis keys of one run, and the index of runs: every key a run owns, under the
contract's prefix (fleetgen/queue/contract.py)."""

from __future__ import annotations

import functools

from fleetgen.queue.contract import PREFIX


class RunKeys:
    """All Redis keys of one run. No TTLs: a run's keys live until `fleetgen purge`,
    because a run may be resumed days later; the large ones (stream, queue) are emptied
    as work is written, the rest is a few bytes per row (bitmaps) or per worker."""

    def __init__(self, run: str) -> None:
        base = f"{PREFIX}:run:{run}"
        self.run = run
        # Append-only log of outcomes (results, failures, rejections). The drainer XDELs
        # entries once they are fsynced to the output files, so it stays small.
        self.stream = f"{base}:events"
        # Hash: settings, total rows, state, timestamps; its fields and their one reader and
        # writer are fleetgen/runstate/manifest.py.
        self.manifest = f"{base}:manifest"
        # Bitmap by input line: the row was enqueued or rejected by the producer.
        self.sent = f"{base}:sent"
        # Bitmap by input line: an outcome for the row is in the stream (set atomically
        # with the XADD). A redelivered task whose bit is set does not call the engine again.
        self.done = f"{base}:done"
        # Hash: counters written by workers (per worker and total) for `status`.
        self.stats = f"{base}:stats"
        # Hash: counters of what the drainer has durably written.
        self.written = f"{base}:written"
        # Hash id -> task payload of failed rows, so `fleetgen retry` can re-enqueue them.
        self.failed = f"{base}:failed"
        # Set of input lines that `fleetgen retry` sent back to work; a worker removes a
        # line when it emits its new outcome. The run is not complete while it is non-empty.
        self.retrying = f"{base}:retrying"
        # Hash HOST/engineN -> JSON of an engine fleetgen started (`--engine-cmd`): its URL,
        # GPUs, phase, restarts, last error; written by its node's supervisor, read by
        # `status` (fleetgen/local/engines.py `publish`).
        self.engines = f"{base}:engines"

    def all(self) -> list[str]:
        return [
            self.stream, self.manifest, self.sent, self.done,
            self.stats, self.written, self.failed, self.retrying, self.engines,
        ]


@functools.lru_cache(maxsize=256)
def run_keys(run: str) -> RunKeys:
    """The run's keys, named once per process: every part of a process that works on the run
    (producer, drainer, sink, status) shares the one object."""
    return RunKeys(run)


def runs_index_key() -> str:
    """Set of run names, for `fleetgen status` without --run."""
    return f"{PREFIX}:runs"
