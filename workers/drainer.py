"""The drainer: the only writer of the output directory; stream -> whole JSONL lines, once each."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import redis

from fleetgen.base.contract import (
    DRAINER_GROUP,
    FINISHED_AT,
    KIND_FAILURE,
    KIND_REJECTED,
    KIND_RESULT,
    KINDS,
    RunKeys,
    blocked_by,
    slot_of,
)
from fleetgen.base.errors import ConfigError
from fleetgen.base.outcomes import QUALITY_COUNTS, quality_counts, read_entry
from fleetgen.base.outdir import FILES, RUN_MARKER, whole_lines_end
from fleetgen.base.redisconn import read_hash
from fleetgen.base.runstate import run_complete, stopped_and_settled

log = logging.getLogger("fleetgen.drainer")

CONSUMER = "drainer"
SUMMARY_EVERY_S = 10.0
# How the drainer notices that Redis lost data (restarted from an older copy): every
# VERIFY_EVERY_S it compares the `written` counts in Redis with its own and Redis's run_id
# with the one it saw last (a few hundred bytes); every COVERAGE_EVERY_S, and at once on
# either sign, it checks that the done bitmap covers every line the files hold.
VERIFY_EVERY_S = 2.0
COVERAGE_EVERY_S = 30.0
BITS_PER_COMMAND = 4096  # offsets per BITFIELD when done bits are written back


CODES = {KIND_RESULT: 1, KIND_FAILURE: 2, KIND_REJECTED: 3}


@dataclass
class Tally:
    """What the output directory holds, rebuilt from the files on every start. One byte per
    input line (which kind holds it), so a 10-million-row run costs 10 MB here."""

    kinds: bytearray = field(default_factory=bytearray)
    bits: bytearray = field(default_factory=bytearray)  # the lines held, as Redis's bitmap
    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    truncated: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # empty, reasoning_unfinished, json_invalid: read from each result record.
    quality: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUALITY_COUNTS, 0))
    # --turns all: failed slot -> the later turns of its conversation it holds back (they have
    # no outcome while the failure stands, and count as settled until a retry succeeds).
    blocked: dict[int, int] = field(default_factory=dict)
    turns: bool = False  # a --turns all run's records seen: `blocked` is counted

    @property
    def written(self) -> int:
        return sum(self.by_kind.values()) + self.held_back

    @property
    def held_back(self) -> int:
        return sum(self.blocked.values())

    def kind_of(self, line: int) -> str | None:
        code = self.kinds[line] if line < len(self.kinds) else 0
        return KINDS[code - 1] if code else None

    def add(self, kind: str, record: dict[str, Any]) -> None:
        line = slot_of(record)  # the request's slot: a line, or one sample of it
        if line >= len(self.kinds):
            self.kinds.extend(bytes(max(line + 1 - len(self.kinds), len(self.kinds))))
        previous = self.kind_of(line)
        if previous is not None:
            self.by_kind[previous] -= 1
        self.kinds[line] = CODES[kind]
        self.by_kind[kind] += 1
        if (line >> 3) >= len(self.bits):
            self.bits.extend(bytes((line >> 3) + 1 - len(self.bits)))
        self.bits[line >> 3] |= 0x80 >> (line & 7)
        self.blocked.pop(line, None)
        self.turns = self.turns or "turn" in record
        if kind == KIND_FAILURE and blocked_by(record):
            self.blocked[line] = blocked_by(record)
        if kind == KIND_RESULT:
            self.truncated += record.get("finish_reason") == "length"
            self.prompt_tokens += int(record.get("prompt_tokens", 0))
            self.completion_tokens += int(record.get("completion_tokens", 0))
            for name, n in quality_counts(record).items():
                self.quality[name] += n

    def missing_from(self, done: bytes) -> list[int]:
        """Lines held here whose bit is clear in `done` (a Redis bitmap, bit 0 the most
        significant of byte 0): one big-integer operation, then only the non-zero bytes."""
        size = len(self.bits)
        held = int.from_bytes(self.bits, "big")
        diff = (held & ~int.from_bytes(done[:size].ljust(size, b"\0"), "big")).to_bytes(
            size, "big")
        return [(index << 3) | bit for index, byte in enumerate(diff) if byte
                for bit in range(8) if byte & (0x80 >> bit)]


def repair_tail(path: Path) -> int:
    """Cut a torn last line (no trailing newline) left by a crash; returns bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as f:
        keep = whole_lines_end(f, size)
        if keep < size:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    return size - keep


def load_file(path: Path, kind: str, tally: Tally) -> None:
    if not path.exists():
        return
    with path.open("rb") as f:
        for raw in f:
            tally.add(kind, orjson.loads(raw))


class Drainer:
    def __init__(self, client: redis.Redis, run: str, out_dir: Path, *, batch: int = 512,
                 block_ms: int = 500, verify_s: float = VERIFY_EVERY_S) -> None:
        self.redis = client
        self.keys = RunKeys(run)
        self.run = run
        self.out = out_dir
        self.batch = batch
        self.block_ms = block_ms
        self.tally = Tally()
        self.verify_s = verify_s
        self._files: dict[str, BinaryIO] = {}
        self._superseded = False
        self.done_bits_restored = 0  # done bits Redis had lost and this drainer set again
        self.losses_noticed = 0
        self._server_id: str | None = None
        self._verify_due = 0.0
        self._coverage_due = 0.0
        self._unreachable_since: float | None = None

    # -- start-up -------------------------------------------------------------------------
    def recover(self) -> None:
        """Repair torn tails, rebuild what was written, and drop failures that a later retry
        turned into results (a crash can leave a row in both for a moment)."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._claim_out_dir()
        for kind in (KIND_FAILURE, KIND_REJECTED, KIND_RESULT):  # results last: they win
            path = self.out / FILES[kind]
            cut = repair_tail(path)
            if cut:
                log.warning("%s: removed a torn last line (%d bytes)", path, cut)
            load_file(path, kind, self.tally)
        self._compact_failures()
        for kind in KINDS:
            self._files[kind] = (self.out / FILES[kind]).open("ab")
        self.reassert_files()

    def _ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.keys.stream, DRAINER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # -- Redis is a cache of what the files hold ----------------------------------------------
    def reassert_files(self) -> None:
        """Tell Redis again what the files hold: the done bit of every line written (so no
        worker generates it again), the `written` counts, and the consumer group. Done at
        start and whenever Redis is seen to have lost data."""
        self._ensure_group()
        restored = self.restore_done_bits()
        if restored:
            log.warning("restored %d done bit(s) that Redis had lost, from the output files",
                        restored)
        self.done_bits_restored += restored
        self._publish_counts(self.redis)
        self._server_id = self._redis_run_id()
        self._coverage_due = time.monotonic() + COVERAGE_EVERY_S

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

    def verify(self) -> None:
        """Notice whether Redis lost data since the last look, and if so reassert the files.
        Signs: the `written` counts differ from this drainer's own (they are published with
        every batch, so a copy older than the last batch shows fewer, or none), Redis's
        run_id changed (it restarted), or the coverage check is due."""
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
        published = read_hash(self.redis, self.keys.written)
        ours = self.counts()
        if any(int(published.get(k, -1)) != v for k, v in ours.items()):
            return "its written counts differ from the files'"
        run_id = self._redis_run_id()
        if run_id != self._server_id:
            return "it restarted"
        return None

    def _redis_run_id(self) -> str | None:
        try:
            return str(self.redis.info("server").get("run_id"))
        except redis.ResponseError:  # INFO disabled (some managed Redis): counts only
            return None

    def _claim_out_dir(self) -> None:
        """One output directory holds one run: mixing two would break exactly-once."""
        marker = self.out / RUN_MARKER
        if marker.exists():
            owner = marker.read_text().strip()
            if owner != self.run:
                raise ConfigError(f"{self.out} holds the output of run {owner!r}, not "
                                  f"{self.run!r}; pick another --out")
            return
        if any((self.out / name).exists() for name in FILES.values()):
            raise ConfigError(f"{self.out} already holds output files of an unknown run; "
                              "pick another --out")
        marker.write_text(self.run + "\n")

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    # -- the loop -------------------------------------------------------------------------
    def run_until_complete(self, follow: bool = False,
                           on_progress: Callable[[Drainer], None] | None = None,
                           should_stop: Callable[[], bool] = lambda: False) -> None:
        self._drain_pending()
        summary_due = time.monotonic() + SUMMARY_EVERY_S
        while not should_stop():
            finished = self._tick_riding_outages(follow, should_stop)
            if finished is None:
                continue
            if on_progress:
                on_progress(self)
            if finished:
                break
            if follow and time.monotonic() >= summary_due:
                # A --follow drainer never exits by itself: keep summary.json current.
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
            self._ensure_group()
            return None
        if self._unreachable_since is not None:
            log.warning("Redis is back after %.1f s", time.monotonic() - self._unreachable_since)
            self._unreachable_since = None
        return finished

    def _tick(self, follow: bool) -> bool:
        if time.monotonic() >= self._verify_due:
            self.verify()
        self.step(block_ms=self.block_ms)
        return not follow and self.ended()

    def _drain_pending(self) -> None:
        """After a restart, our own read-but-unacked entries come first (id 0)."""
        while self.step(read_id="0", block_ms=None):
            pass

    def step(self, read_id: str = ">", block_ms: int | None = 1000) -> int:
        """Read one batch, write it durably, then ack and delete it. Returns entries read."""
        reply: Any = self.redis.xreadgroup(DRAINER_GROUP, CONSUMER, {self.keys.stream: read_id},
                                      count=self.batch, block=block_ms)
        entries: list[tuple[bytes, dict[bytes, bytes]]] = reply[0][1] if reply else []
        if not entries:
            return 0
        self._write(entries)
        ids = [entry_id for entry_id, _ in entries]
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(self.keys.stream, DRAINER_GROUP, *ids)
        pipe.xdel(self.keys.stream, *ids)  # written and fsynced: the stream forgets it
        self._publish_counts(pipe)
        pipe.execute()
        return len(entries)

    def _write(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        touched: set[str] = set()
        for _, fields in entries:
            entry = read_entry(fields)
            if entry is None:
                continue
            kind, raw = entry  # a worker's orjson: one line, written as it came
            record = orjson.loads(raw)
            if not self._is_new(kind, slot_of(record)):
                continue
            self._files[kind].write(raw + b"\n")
            self.tally.add(kind, record)
            touched.add(kind)
        # Write, flush, fsync, and only then ack: a crash re-reads, never loses.
        for kind in touched:
            f = self._files[kind]
            f.flush()
            os.fsync(f.fileno())
        if self._superseded:
            self._compact_failures()

    def _is_new(self, kind: str, line: int) -> bool:
        previous = self.tally.kind_of(line)
        if previous is None:
            return True
        if previous == KIND_FAILURE and kind == KIND_RESULT:
            self._superseded = True  # a retried row succeeded: it moves to results
            return True
        return False

    def _compact_failures(self) -> None:
        """Rewrite failures.jsonl without rows that now have a result (atomic rename)."""
        self._superseded = False
        path = self.out / FILES[KIND_FAILURE]
        if not path.exists():
            return
        with path.open("rb") as f:
            rows = f.readlines()
        keep = [r for r in rows if self.tally.kind_of(slot_of(orjson.loads(r))) == KIND_FAILURE]
        if len(keep) == len(rows):
            return
        old = self._files.pop(KIND_FAILURE, None)
        if old:
            old.close()
        tmp = path.with_suffix(".jsonl.tmp")
        with tmp.open("wb") as f:
            f.writelines(keep)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.out)
        if old:
            self._files[KIND_FAILURE] = path.open("ab")

    # -- completion and summary -------------------------------------------------------------
    def manifest(self) -> dict[str, str]:
        return read_hash(self.redis, self.keys.manifest)

    def complete(self, manifest: dict[str, str] | None = None) -> bool:
        return run_complete(self.redis, self.run, self.tally.written, manifest)

    def stopped(self, manifest: dict[str, str] | None = None) -> str | None:
        """Why the run was stopped early, once all it sent before the stop is written."""
        return stopped_and_settled(self.redis, self.run, self.tally.written, manifest)

    def ended(self) -> bool:
        """Complete, or stopped early and settled: one read of the manifest for both."""
        manifest = self.manifest()
        return self.complete(manifest) or self.stopped(manifest) is not None

    def _publish_counts(self, pipe: Any) -> None:
        pipe.hset(self.keys.written, mapping=self.counts())

    def counts(self) -> dict[str, int]:
        return {
            "done": self.tally.by_kind[KIND_RESULT],
            "failed": self.tally.by_kind[KIND_FAILURE],
            "rejected": self.tally.by_kind[KIND_REJECTED],
            **({"blocked": self.tally.held_back} if self.tally.turns else {}),
            "truncated": self.tally.truncated,
            "prompt_tokens": self.tally.prompt_tokens,
            "completion_tokens": self.tally.completion_tokens,
            **self.tally.quality,
        }

    def write_summary(self) -> dict[str, Any]:
        m = self.manifest()
        counts = self.counts()
        complete, stopped = self.complete(m), self.stopped(m)
        started = float(m.get("started_at", "0") or 0)
        finished = self._finished_at(m, ended=complete or stopped is not None)
        wall_s = max(finished - started, 1e-9) if started else None
        summary: dict[str, Any] = {
            "run": self.run,
            "total": int(m.get("total", "0") or 0) or self.tally.written,
            **counts,
            "complete": complete,
            "stopped": stopped,
            "started_at": started or None,
            "finished_at": finished,
            "wall_s": round(wall_s, 3) if wall_s else None,
            "rows_per_s": round(self.tally.written / wall_s, 2) if wall_s else None,
            "completion_tokens_per_s": (round(counts["completion_tokens"] / wall_s, 1)
                                        if wall_s else None),
            "settings": summary_settings(m),
        }
        tmp = self.out / "summary.json.tmp"
        tmp.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
        os.replace(tmp, self.out / "summary.json")
        return summary

    def _finished_at(self, m: dict[str, str], ended: bool) -> float:
        """When the run ended, pinned in the manifest the first time it is seen ended, so
        `status` stops its clock there and a later drain writes the same figures."""
        if not ended:
            return time.time()
        if m.get(FINISHED_AT):
            return float(m[FINISHED_AT])
        now = time.time()
        self.redis.hset(self.keys.manifest, FINISHED_AT, now)
        return now


# The run's settings copied into summary.json, so an export made from the files alone (long
# after `fleetgen purge`) knows how prompts were rendered (`--format tokens` re-renders them).
# What changes a row, never a URL or anything that may hold a secret.
SUMMARY_SETTINGS = ("tokenizer", "chat_template_kwargs", "token_ids", "logprobs", "reasoning",
                    "n", "sampling", "context_length", "max_output_tokens", "turns")


def summary_settings(manifest: dict[str, str]) -> dict[str, Any] | None:
    """The manifest's settings named in SUMMARY_SETTINGS, or None without a manifest."""
    try:
        settings = orjson.loads(manifest["settings"])
    except (KeyError, orjson.JSONDecodeError):
        return None
    return {name: settings[name] for name in SUMMARY_SETTINGS if name in settings}


def _pause(seconds: float, should_stop: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not should_stop():
        time.sleep(0.05)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
