"""The run's bookkeeping, as the drainer keeps it: the manifest read, the counts of what the
files hold published to Redis (and the done bits set again when Redis lost them), whether the
run has ended, and its summary."""

from __future__ import annotations

import time
from typing import Any

import redis

from fleetgen.drainer.acceptance import pooled_summary
from fleetgen.drainer.store import Tally
from fleetgen.queue.contract import KIND_FAILURE, KIND_HOLDOUT, KIND_REJECTED, KIND_RESULT
from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import run_keys
from fleetgen.runstate.lifecycle import run_complete, stopped_and_settled
from fleetgen.runstate.manifest import Manifest, RunManifest
from fleetgen.settings.runoptions import SUMMARY_SETTINGS

BITS_PER_COMMAND = 4096  # offsets per BITFIELD when done bits are written back
# A run's clock counts the time it worked, not the time it was stopped: a drainer starting on
# a run that has not ended adds to the manifest's pause the time since the run last moved
# (its drainer's last stamp, ACTIVE_AT in the `written` hash, or its last outcome's stream id),
# if longer than this (a drainer restarted at once, workers at work, pauses nothing).
PAUSE_MIN_S = 5.0
ACTIVE_AT = "active_at"


def summary_settings(manifest: Manifest) -> dict[str, Any] | None:
    """The run's settings copied into summary.json (fleetgen/settings/runoptions.py
    SUMMARY_SETTINGS), so an export made from the files alone (long after `fleetgen purge`)
    knows how prompts were rendered; None without stored settings."""
    if manifest.settings is None:
        return None
    return {name: manifest.settings[name] for name in SUMMARY_SETTINGS
            if name in manifest.settings}


class RunBook:
    """One run's record in Redis, against `tally` (what the files hold: the truth)."""

    def __init__(self, client: redis.Redis, run: str, tally: Tally) -> None:
        self.redis = client
        self.run = run
        self.keys = run_keys(run)
        self.tally = tally
        self.record = RunManifest(client, run)

    def manifest(self) -> Manifest:
        return self.record.read()

    def complete(self, manifest: Manifest | None = None) -> bool:
        return run_complete(self.redis, self.run, self.tally.written, manifest)

    def stopped(self, manifest: Manifest | None = None) -> str | None:
        """Why the run was stopped early, once all it sent before the stop is written."""
        return stopped_and_settled(self.redis, self.run, self.tally.written, manifest)

    def ended(self) -> bool:
        """Complete, or stopped early and settled: one read of the manifest for both."""
        manifest = self.manifest()
        return self.complete(manifest) or self.stopped(manifest) is not None

    def counts(self) -> dict[str, int]:
        return {
            "done": self.tally.by_kind[KIND_RESULT],
            "failed": self.tally.by_kind[KIND_FAILURE],
            "rejected": self.tally.by_kind[KIND_REJECTED],
            "holdout": self.tally.by_kind[KIND_HOLDOUT],  # requests never sent: holdout.jsonl
            "holdout_rows": len(self.tally.holdout_firsts),  # its lines: input rows
            **({"blocked": self.tally.held_back} if self.tally.turns else {}),
            "truncated": self.tally.truncated,
            "reused": self.tally.reused,  # of `done`: the estimate's answers, never sent
            "prompt_tokens": self.tally.prompt_tokens,
            "completion_tokens": self.tally.completion_tokens,
            **self.tally.quality,
        }

    def publish_counts(self, pipe: Any) -> None:
        # With the stamp that the run moved (the drainer's loop passes here at least every
        # VERIFY_EVERY_S): what a resume measures the pause from.
        pipe.hset(self.keys.written, mapping={**self.counts(), ACTIVE_AT: time.time()})

    def resume_clock(self, now: float | None = None) -> float:
        """On a drainer's start: the seconds the run stood still since it last moved, added
        to its `paused_s` (0 if it has ended, never moved, or moved just now)."""
        now = time.time() if now is None else now
        m = self.manifest()
        if not m.exists or m.finished_at:
            return 0.0
        moved = [float(read_hash(self.redis, self.keys.written).get(ACTIVE_AT) or 0),
                 self._last_outcome_at()]
        last = max(moved)
        paused = now - last if last else 0.0
        if paused < PAUSE_MIN_S:
            return 0.0
        self.record.add_pause(paused)
        return paused

    def _last_outcome_at(self) -> float:
        """When a worker last wrote an outcome: the stream's last id is its time in ms, kept
        after the entries are deleted."""
        try:
            last = self.redis.xinfo_stream(self.keys.stream)["last-generated-id"]
        except redis.ResponseError:  # no stream yet
            return 0.0
        ms = (last.decode() if isinstance(last, bytes) else str(last)).split("-")[0]
        return int(ms) / 1000 if ms.isdigit() else 0.0

    def published_differ(self) -> bool:
        """Whether the `written` counts in Redis differ from the files' (they are published
        with every batch, so a copy older than the last batch shows fewer, or none)."""
        published = read_hash(self.redis, self.keys.written)
        return any(int(published.get(k, -1)) != v for k, v in self.counts().items())

    def restore_done_bits(self) -> int:
        """Set the done bit of every line the files hold that lacks it, except rows that
        `fleetgen retry` sent back to work (WATCH: a retry landing meanwhile restarts this,
        so a bit it just cleared is never set again behind its back)."""
        while True:
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(self.keys.retrying)
                    raw = pipe.get(self.keys.done) or b""
                    done = raw.encode() if isinstance(raw, str) else bytes(raw)
                    retrying = {int(x) for x in pipe.smembers(self.keys.retrying)}
                    missing = [n for n in self.tally.missing_from(done)
                               if n not in retrying]
                    pipe.multi()
                    for start in range(0, len(missing), BITS_PER_COMMAND):
                        args: list[Any] = []
                        for line in missing[start:start + BITS_PER_COMMAND]:
                            args += ["SET", "u1", line, 1]
                        pipe.execute_command("BITFIELD", self.keys.done, *args)
                    pipe.execute()
                    return len(missing)
                except redis.WatchError:
                    continue

    def summary(self) -> dict[str, Any]:
        """The run's summary as of now: one read of the manifest for all of it."""
        m = self.manifest()
        counts = self.counts()
        written = self.tally.written
        complete, stopped = self.complete(m), self.stopped(m)
        started = m.started_at or 0.0
        finished = self._finished_at(m, ended=complete or stopped is not None)
        # The time the run worked: a resumed run's stops are not in it (resume_clock).
        paused = m.paused_s
        wall_s = max(finished - started - paused, 1e-9) if started else None
        return {
            "run": self.run,
            # The input's rows (times --n): a run stopped early (--stop-if) or still being
            # read says how many of them it has, not just the ones it read.
            "total": m.rows or written,
            # The input's rows (JSONL lines): fewer than `total` with samples or turns.
            "input_rows": m.input_rows,
            **counts,
            "complete": complete,
            "stopped": stopped,
            "started_at": started or None,
            "finished_at": finished,
            "wall_s": round(wall_s, 3) if wall_s else None,
            "paused_s": round(paused, 1),
            "rows_per_s": round(written / wall_s, 2) if wall_s else None,
            "completion_tokens_per_s": (round(counts["completion_tokens"] / wall_s, 1)
                                        if wall_s else None),
            "settings": summary_settings(m),
            # Only where some answer carried its speculative figures (drainer/acceptance.py).
            **({"spec": pooled_summary(self.tally.spec, self.tally.spec_by_worker,
                                       counts["done"], self.tally.spec_counters)}
               if self.tally.spec.requests or self.tally.spec_counters.latest else {}),
        }

    def _finished_at(self, m: Manifest, ended: bool) -> float:
        """When the run ended, pinned in the manifest the first time it is seen ended, so
        `status` stops its clock there and a later drain writes the same figures."""
        if not ended:
            return time.time()
        if m.finished_at:
            return m.finished_at
        now = time.time()
        self.record.pin_finished(now)
        return now
