"""The drainer's file store: what the output directory holds (the tally, rebuilt from the files
on every start) and the writes that change it, each through fleetgen/records/outdir.py."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fleetgen.drainer.acceptance import CounterSessions, Pool
from fleetgen.queue.contract import (
    KIND_FAILURE,
    KIND_HOLDOUT,
    KIND_REJECTED,
    KIND_RESULT,
    KINDS,
    blocked_by,
    slot_of,
    slots_of,
)
from fleetgen.records.outcomes import QUALITY_COUNTS, quality_counts
from fleetgen.records.outdir import OutputDir
from fleetgen.runstate.bitmap import Bits

log = logging.getLogger("fleetgen.drainer")

CODES = {KIND_RESULT: 1, KIND_FAILURE: 2, KIND_REJECTED: 3, KIND_HOLDOUT: 4}


@dataclass
class Tally:
    """What the output directory holds, rebuilt from the files on every start. One byte per
    input line (which kind holds it), so a 10-million-row run costs 10 MB here."""

    kinds: bytearray = field(default_factory=bytearray)
    bits: Bits = field(default_factory=Bits)  # the lines held, as Redis's bitmap
    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    truncated: int = 0
    reused: int = 0  # results that are earlier answers (`reused`: producer/reuse.py), not sent
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # empty, reasoning_unfinished, json_invalid: read from each result record.
    quality: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUALITY_COUNTS, 0))
    # Lines of holdout.jsonl: input rows, where by_kind counts the requests (a row of --n 4
    # samples or four turns is four).
    holdout_firsts: set[int] = field(default_factory=set)
    # --turns all: failed slot -> the later turns of its conversation it holds back (they have
    # no outcome while the failure stands, and count as settled until a retry succeeds).
    blocked: dict[int, int] = field(default_factory=dict)
    turns: bool = False  # a --turns all run's records seen: `blocked` is counted
    # Speculative acceptance of the results that carry `spec`, overall and by worker.
    spec: Pool = field(default_factory=Pool)
    spec_by_worker: dict[str, Pool] = field(default_factory=dict)
    spec_counters: CounterSessions = field(default_factory=CounterSessions)  # vLLM's

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
        # A holdout line stands for every request of its row; any other record for one.
        slots = slots_of(record) if kind == KIND_HOLDOUT else (slot_of(record),)
        for line in slots:
            self._mark(line, kind)
        if kind == KIND_HOLDOUT:
            self.holdout_firsts.add(slots[0])  # a line sent again is one row still
        line = slots[0]
        self.blocked.pop(line, None)
        self.turns = self.turns or "turn" in record
        if kind == KIND_FAILURE and blocked_by(record):
            self.blocked[line] = blocked_by(record)
        if kind == KIND_RESULT:
            self.truncated += record.get("finish_reason") == "length"
            self.reused += bool(record.get("reused"))
            self.prompt_tokens += int(record.get("prompt_tokens", 0))
            self.completion_tokens += int(record.get("completion_tokens", 0))
            for name, n in quality_counts(record).items():
                self.quality[name] += n
            self.spec_counters.add(record)
            if self.spec.add(record):
                worker = str(record.get("worker") or "?")
                self.spec_by_worker.setdefault(worker, Pool()).add(record)

    def _mark(self, line: int, kind: str) -> None:
        """The request of slot `line` is held in `kind`'s file (moved there, if elsewhere)."""
        if line >= len(self.kinds):
            self.kinds.extend(bytes(max(line + 1 - len(self.kinds), len(self.kinds))))
        previous = self.kind_of(line)
        if previous is not None:
            self.by_kind[previous] -= 1
        self.kinds[line] = CODES[kind]
        self.by_kind[kind] += 1
        self.bits.add(line)

    def lines_of(self, kind: str) -> list[int]:
        """The lines (slots) whose outcome in the files is `kind`."""
        code = CODES[kind]
        return [line for line, held in enumerate(self.kinds) if held == code]

    def missing_from(self, done: bytes) -> list[int]:
        """Lines held here whose bit is clear in `done` (the run's Redis bitmap)."""
        return self.bits.not_in(done)


def load_file(path: Path, kind: str, tally: Tally) -> None:
    if not path.exists():
        return
    with path.open("rb") as f:
        for raw in f:
            tally.add(kind, orjson.loads(raw))


class FileStore:
    """The output directory as the drainer sees it: every outcome it holds, once. A retried
    row that succeeds moves from failures to results (a crash can leave it in both for a
    moment: the result wins, and the failure is compacted away)."""

    def __init__(self, run: str, path: Path) -> None:
        self.run = run
        self.dir = OutputDir(path)
        self.tally = Tally()
        self._superseded = False

    def recover(self) -> None:
        """Claim the directory, repair torn tails, rebuild the tally, and drop failures that a
        later retry turned into results."""
        self.dir.claim(self.run)
        # results last: they win
        for kind in (KIND_FAILURE, KIND_REJECTED, KIND_HOLDOUT, KIND_RESULT):
            cut = self.dir.repair(kind)
            if cut:
                log.warning("%s: removed a torn last line (%d bytes)", self.dir.file(kind), cut)
            load_file(self.dir.file(kind), kind, self.tally)
        self._compact_failures()
        self.dir.open_appends()

    def write(self, outcomes: Iterable[tuple[str, bytes]]) -> None:
        """Append the new ones of (kind, a worker's one-line JSON) and fsync each file touched:
        when this returns they are durable, and only then may the stream forget them."""
        batch: dict[str, list[bytes]] = {}
        for kind, raw in outcomes:
            record = orjson.loads(raw)
            if not self._is_new(kind, slot_of(record)):
                continue
            batch.setdefault(kind, []).append(raw)  # written as it came
            self.tally.add(kind, record)
        for kind, lines in batch.items():
            self.dir.append(kind, lines)
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
        """Rewrite the failures file without rows that now have a result (atomically)."""
        self._superseded = False
        path = self.dir.file(KIND_FAILURE)
        if not path.exists():
            return
        with path.open("rb") as f:
            rows = f.readlines()
        keep = [r for r in rows if self.tally.kind_of(slot_of(orjson.loads(r))) == KIND_FAILURE]
        if len(keep) != len(rows):
            self.dir.replace(KIND_FAILURE, keep)

    def write_summary(self, summary: dict[str, Any]) -> None:
        self.dir.write_summary(summary)

    def close(self) -> None:
        self.dir.close()
