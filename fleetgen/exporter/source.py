"""A drained output directory read back (files only, never Redis): the run it holds, and its
outcomes gathered by input line in input order, whatever order the drainer wrote them in.

The drainer appends in drain order and interleaves three files, so one pass builds an index of
byte offsets (about 30 bytes a record: 300 MB for ten million), sorted by input line and
sample; the records themselves are read again one by one, so memory holds one group at a time.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import orjson

from fleetgen.errors import InputError
from fleetgen.queue.contract import KIND_FAILURE, KIND_HOLDOUT, KIND_REJECTED, KIND_RESULT
from fleetgen.records.outdir import FILES, RUN_MARKER, OutputDir, whole_lines_end

log = logging.getLogger("fleetgen.exporter")

# Within one (line, sample) a result wins over a failure (a retried row that succeeded: the
# drainer's own recovery keeps the result too), and both over a rejection.
PRIORITY = {KIND_RESULT: 0, KIND_FAILURE: 1, KIND_REJECTED: 2}
KINDS = tuple(PRIORITY)
NO_SAMPLE = -1  # the sort key of a record without `sample`: a row asked for once
Observer = Callable[[dict[str, Any], int], None]


class DrainedLine(NamedTuple):
    """One outcome as the output files hold it: its kind (the file), its record, its size."""

    kind: str
    record: dict[str, Any]
    size: int  # bytes of its line in the output file


@dataclass(frozen=True)
class RunInfo:
    run: str
    summary: dict[str, Any] | None  # summary.json, or None if the drainer never wrote one
    created: int  # unix seconds: when the drainer finished (else when results were last written)

    @property
    def complete(self) -> bool:
        return bool(self.summary and self.summary.get("complete"))

    @property
    def stopped(self) -> str | None:
        """Why `--stop-if` stopped the run, if it did: its drain has ended with what was sent."""
        stopped = (self.summary or {}).get("stopped")
        return str(stopped) if stopped else None

    @property
    def turns_all(self) -> bool:
        """Every assistant turn was regenerated (`--turns all`): results carry `turn`."""
        return ((self.summary or {}).get("settings") or {}).get("turns") == "all"

    @property
    def model(self) -> str | None:
        model = (self.summary or {}).get("model")
        return str(model) if model else None


@dataclass
class Index:
    """Where every record of the chosen kinds is, in (line, sample, priority) order."""

    files: dict[int, BinaryIO]  # by kind code
    columns: dict[str, array[int]]
    order: Any  # numpy int64: positions in `columns`, sorted
    progress: Callable[[int], None]
    superseded: int = 0  # records hidden by a better one for the same line and sample

    def __len__(self) -> int:
        return len(self.order)

    def groups(self) -> Iterator[list[DrainedLine]]:
        """One list per input line, its samples in order, one outcome per sample (per
        sample and turn, turns in order, for a --turns all run)."""
        lines, samples, turns = (self.columns[k] for k in ("line", "sample", "turn"))
        kinds, offsets, lengths = (self.columns[k] for k in ("kind", "offset", "length"))
        group: list[DrainedLine] = []
        current = (-1, -1, -1)  # no line has this key
        for position in _positions(self.order):
            key = (lines[position], samples[position], turns[position])
            if key == current:
                self.superseded += 1
                continue
            if key[0] != current[0] and group:
                yield group
                group = []
            current = key
            raw = os.pread(self.files[kinds[position]].fileno(), lengths[position],
                           offsets[position])
            group.append(DrainedLine(KINDS[kinds[position]], orjson.loads(raw), len(raw)))
            self.progress(len(raw))
        if group:
            yield group


def _positions(order: Any, chunk: int = 1 << 16) -> Iterator[int]:
    for start in range(0, len(order), chunk):  # as Python ints, a chunk at a time
        yield from order[start:start + chunk].tolist()


@dataclass
class DrainedRun:
    """A drained run read back from its files for export and the report: the directory
    `fleetgen drain` wrote (fleetgen/records/outdir.py `OutputDir`), checked and opened for reading,
    with the run it holds and its outcomes in input order. Each file is read up to its last
    whole line as it was when opened: a drainer still writing (or one killed mid-line) adds
    nothing half-written to an export."""

    path: Path
    progress: Callable[[int], None] = lambda nbytes: None  # bytes scanned, then bytes read
    info: RunInfo = field(init=False)
    torn: dict[str, int] = field(init=False, default_factory=dict)  # file -> bytes skipped
    _files: dict[str, BinaryIO] = field(init=False, default_factory=dict)
    _ends: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        _check_is_output(self.path)
        directory = OutputDir(self.path)
        # holdout.jsonl too, for `records` (the report counts it); never in an index: a
        # held-out row is no answer to export.
        for kind in (*KINDS, KIND_HOLDOUT):
            file_path = directory.file(kind)
            if not file_path.exists():
                continue
            f = file_path.open("rb")
            self._files[kind] = f
            size = os.fstat(f.fileno()).st_size
            self._ends[kind] = whole_lines_end(f, size)
            if self._ends[kind] < size:
                self.torn[FILES[kind]] = size - self._ends[kind]
        self.info = _run_info(directory)

    def size(self, kinds: tuple[str, ...]) -> int:
        """Bytes of whole lines in the files of `kinds`."""
        return sum(self._ends.get(kind, 0) for kind in kinds)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self) -> DrainedRun:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def index(self, kinds: tuple[str, ...],
              observe: Observer | None = None) -> Index:
        """Scan the files of `kinds` once; `observe` sees every result record on the way, with
        the size of its line."""
        columns: dict[str, array[int]] = {
            "line": array("q"), "sample": array("q"), "turn": array("q"), "kind": array("b"),
            "priority": array("b"), "offset": array("q"), "length": array("I")}
        files: dict[int, BinaryIO] = {}
        for kind in kinds:
            if kind in self._files:
                files[KINDS.index(kind)] = self._files[kind]
                self._scan(kind, columns, observe if kind == KIND_RESULT else None)
        # lexsort: the last key is the primary one; it is stable, so a tie keeps file order.
        order = np.lexsort((np.frombuffer(columns["priority"], dtype=np.int8),
                            np.frombuffer(columns["turn"], dtype=np.int64),
                            np.frombuffer(columns["sample"], dtype=np.int64),
                            np.frombuffer(columns["line"], dtype=np.int64)))
        return Index(files, columns, order, self.progress)

    def records(self, kind: str) -> Iterator[tuple[dict[str, Any], int]]:
        """Every record of `kind`'s file in file order, with the size of its line: whole
        lines only, as the file was when opened (none when the file does not exist)."""
        if kind not in self._files:
            return
        f, end, name = self._files[kind], self._ends[kind], FILES[kind]
        f.seek(0)
        offset = 0
        for number, raw in enumerate(f, start=1):
            if offset + len(raw) > end:
                return  # past the whole lines seen at open: a torn tail or a newer line
            yield _parse(raw, name, number), len(raw)
            offset += len(raw)
            self.progress(len(raw))

    def _scan(self, kind: str, columns: dict[str, array[int]],
              observe: Observer | None) -> None:
        offset = 0
        code, priority = KINDS.index(kind), PRIORITY[kind]
        for record, size in self.records(kind):
            sample = record.get("sample")
            columns["line"].append(int(record["line"]))
            columns["sample"].append(NO_SAMPLE if sample is None else int(sample))
            turn = record.get("turn") if self.info.turns_all else None
            columns["turn"].append(int(turn or 0))  # --turns all: 1..
            columns["kind"].append(code)
            columns["priority"].append(priority)
            columns["offset"].append(offset)
            columns["length"].append(size)
            if observe is not None:
                observe(record, size)
            offset += size


def _check_is_output(path: Path) -> None:
    hint = "pass the directory given to `fleetgen drain --out`"
    if not path.exists():
        raise InputError(f"no such directory: {path}; {hint}")
    if not path.is_dir():
        raise InputError(f"{path} is a file, not an output directory; {hint}")
    directory = OutputDir(path)
    if not directory.marker.exists():
        raise InputError(f"{path} is not a drained output directory (no {RUN_MARKER} marker, "
                         f"which `fleetgen drain` writes first); {hint}")
    if not directory.file(KIND_RESULT).exists():
        raise InputError(f"{path} has no {FILES[KIND_RESULT]}: `fleetgen drain` has not "
                         "written to it yet")


def _parse(raw: bytes, name: str, number: int) -> dict[str, Any]:
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{name}: line {number} is not valid JSON ({exc}): the file is "
                         "damaged (only a torn last line is expected after a crash)") from exc
    if not isinstance(record, dict) or not isinstance(record.get("line"), int) \
            or "id" not in record:
        raise InputError(f"{name}: line {number} is not a fleetgen record (no id or line "
                         "number)")
    return record


def _run_info(directory: OutputDir) -> RunInfo:
    run = directory.owner() or ""
    summary: dict[str, Any] | None = None
    try:
        summary = directory.read_summary()
    except orjson.JSONDecodeError:
        log.warning("%s is not valid JSON; ignored", directory.summary_path)
    finished = (summary or {}).get("finished_at")
    created = int(finished) if isinstance(finished, int | float) else \
        int(directory.file(KIND_RESULT).stat().st_mtime)
    return RunInfo(run, summary, created)

