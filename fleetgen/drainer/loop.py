"""The drainer's loop: the stream to whole JSONL lines, once each, riding out Redis outages and
noticing when Redis comes back with less than the files hold (Redis is a cache of the files)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from fleetgen.drainer.bookkeeping import RunBook
from fleetgen.drainer.store import FileStore, Tally
from fleetgen.drainer.stream import StreamConsumer, outcomes
from fleetgen.runstate.manifest import Manifest

log = logging.getLogger("fleetgen.drainer")

SUMMARY_EVERY_S = 10.0
# How the drainer notices that Redis lost data (restarted from an older copy): every
# VERIFY_EVERY_S it compares the `written` counts in Redis with its own and Redis's run_id
# with the one it saw last (a few hundred bytes); every COVERAGE_EVERY_S, and at once on
# either sign, it checks that the done bitmap covers every line the files hold.
VERIFY_EVERY_S = 2.0
COVERAGE_EVERY_S = 30.0


class Drainer:
    def __init__(self, client: redis.Redis, run: str, out_dir: Path, *, batch: int = 512,
                 block_ms: int = 500, verify_s: float = VERIFY_EVERY_S) -> None:
        self.redis = client
        self.run = run
        self.out = out_dir
        self.block_ms = block_ms
        self.verify_s = verify_s
        self.store = FileStore(run, out_dir)
        self.book = RunBook(client, run, self.store.tally)
        self.stream = StreamConsumer(client, self.book.keys, batch)
        self.keys = self.book.keys
        self.done_bits_restored = 0  # done bits Redis had lost and this drainer set again
        self.losses_noticed = 0
        self._server_id: str | None = None
        self._verify_due = 0.0
        self._coverage_due = 0.0
        self._unreachable_since: float | None = None

    @property
    def tally(self) -> Tally:
        return self.store.tally

    # -- start and stop -------------------------------------------------------------------
    def recover(self) -> None:
        """Bring the files to whole lines and the tally to what they hold, then tell Redis;
        a run resumed after a stop leaves the stop out of its clock (before the counts are
        published: publishing stamps the run as moving)."""
        self.store.recover()
        paused = self.book.resume_clock()
        if paused:
            log.info("run %s resumed after %.1f s stopped (not counted in its wall time)",
                     self.run, paused)
        # A Redis with no done bitmap for the run has lost nothing: it is new (a finished
        # run's state is deleted; a rerun starts on a fresh Valkey) and learns the files.
        self.reassert_files(fresh=not self.redis.exists(self.keys.done))

    def close(self) -> None:
        self.store.close()

    # -- Redis is a cache of what the files hold ----------------------------------------------
    def reassert_files(self, fresh: bool = False) -> None:
        """Tell Redis again what the files hold: the done bit of every line written (so no
        worker generates it again), the `written` counts, and the consumer group. Done at
        start (`fresh`: Redis holds nothing of the run yet) and whenever Redis is seen to
        have lost data."""
        self.stream.ensure_group()
        restored = self.book.restore_done_bits()
        if restored and fresh:
            log.info("the output files hold %d request(s) of run %s already: marked done, "
                     "none is sent again", restored, self.run)
        elif restored:
            log.warning("restored %d done bit(s) that Redis had lost, from the output files",
                        restored)
            self.done_bits_restored += restored
        self.book.publish_counts(self.redis)
        self._server_id = self._redis_run_id()
        self._coverage_due = time.monotonic() + COVERAGE_EVERY_S

    def verify(self) -> None:
        """Notice whether Redis lost data since the last look, and if so reassert the files.
        Signs: the `written` counts differ from this drainer's own, Redis's run_id changed
        (it restarted), or the coverage check is due."""
        self._verify_due = time.monotonic() + self.verify_s
        reason = self._loss_sign()
        if reason is None and time.monotonic() < self._coverage_due:
            return
        if reason is not None:
            self.losses_noticed += 1
            log.warning("Redis lost data (%s): re-asserting what the output files hold",
                        reason)
        self.reassert_files()
        if reason is not None:
            self._drain_pending()  # an older copy's pending entries are ours to read again

    def _loss_sign(self) -> str | None:
        if self.book.published_differ():
            return "its written counts differ from the files'"
        if self._redis_run_id() != self._server_id:
            return "it restarted"
        return None

    def _redis_run_id(self) -> str | None:
        try:
            return str(self.redis.info("server").get("run_id"))
        except redis.ResponseError:  # INFO disabled (some managed Redis): counts only
            return None

    # -- the loop -------------------------------------------------------------------------
    def run_until_complete(self, follow: bool = False,
                           should_stop: Callable[[], bool] = lambda: False) -> None:
        for _ in self.ticks(follow, should_stop):
            pass

    def ticks(self, follow: bool = False,
              should_stop: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """Drains until the run is complete (or `should_stop`), yielding after each tick that
        reached Redis (True at the last): the caller shows progress between two ticks. The
        summary is written when the run ends or `should_stop` (a caller that leaves the loop
        otherwise writes it itself)."""
        self._drain_pending()
        summary_due = time.monotonic() + SUMMARY_EVERY_S
        while not should_stop():
            finished = self._tick_riding_outages(follow, should_stop)
            if finished is None:
                continue
            yield finished
            if finished:
                break
            if follow and time.monotonic() >= summary_due:
                # A --follow drainer never exits by itself: keep the summary current.
                self.write_summary()
                summary_due = time.monotonic() + SUMMARY_EVERY_S
        self.write_summary()

    def _tick_riding_outages(self, follow: bool, should_stop: Callable[[], bool]) -> bool | None:
        """One tick; None if Redis was unreachable or had lost the stream's group. Redis
        coming back may be an older copy of itself: the next tick verifies at once."""
        try:
            finished = self._tick(follow)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if self._unreachable_since is None:
                self._unreachable_since = time.monotonic()
                log.warning("Redis unreachable (%s); retrying until it is back", exc)
            self._verify_due = 0.0
            _pause(0.2, should_stop)
            return None
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("the stream or its consumer group is gone: Redis lost data")
            self._coverage_due = self._verify_due = 0.0
            self.stream.ensure_group()
            return None
        if self._unreachable_since is not None:
            log.warning("Redis is back after %.1f s", time.monotonic() - self._unreachable_since)
            self._unreachable_since = None
        return finished

    def _tick(self, follow: bool) -> bool:
        if time.monotonic() >= self._verify_due:
            self.verify()
        self.step(block_ms=self.block_ms)
        return not follow and self.book.ended()

    def _drain_pending(self) -> None:
        """After a restart, our own read-but-unacked entries come first (id 0)."""
        while self.step(read_id="0", block_ms=None):
            pass

    def step(self, read_id: str = ">", block_ms: int | None = 1000) -> int:
        """Read one batch, write it durably, then ack and delete it. Returns entries read."""
        entries = self.stream.read(read_id, block_ms)
        if not entries:
            return 0
        # Write, flush, fsync, and only then ack: a crash re-reads, never loses.
        self.store.write(outcomes(entries))
        self.stream.forget(entries, also=self.book.publish_counts)
        return len(entries)

    # -- the run's state, as the files hold it ------------------------------------------------
    def manifest(self) -> Manifest:
        return self.book.manifest()

    def complete(self, manifest: Manifest | None = None) -> bool:
        return self.book.complete(manifest)

    def stopped(self, manifest: Manifest | None = None) -> str | None:
        return self.book.stopped(manifest)

    def ended(self) -> bool:
        return self.book.ended()

    def counts(self) -> dict[str, int]:
        return self.book.counts()

    def write_summary(self) -> dict[str, Any]:
        summary = self.book.summary()
        self.store.write_summary(summary)
        return summary


def _pause(seconds: float, should_stop: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not should_stop():
        time.sleep(0.05)
