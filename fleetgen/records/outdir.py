"""A drained output directory and its one owner: the names of its files, and every way they are
written (claimed for a run, a torn tail cut, whole lines appended with fsync, a file replaced
atomically, the summary written durably; a full disk is a DiskFull that leaves each file as it
was). The drainer writes through it; the exporter, the report, the producer and the demo read
its names and the summary through it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Final

import orjson

from fleetgen.errors import ConfigError
from fleetgen.queue.contract import KIND_FAILURE, KIND_HOLDOUT, KIND_REJECTED, KIND_RESULT
from fleetgen.records import diskfull

# One JSONL file per outcome kind; every input row ends in exactly one of them. The holdout
# (--holdout) is there only in a run that holds rows out: the others are always created.
FILES: Final = {KIND_RESULT: "results.jsonl", KIND_FAILURE: "failures.jsonl",
                KIND_REJECTED: "rejected.jsonl", KIND_HOLDOUT: "holdout.jsonl"}
ALWAYS: Final = (KIND_RESULT, KIND_FAILURE, KIND_REJECTED)
# Written first by the drainer, holding the run's name: it ties the directory to one run.
RUN_MARKER: Final = ".fleetgen-run"
SUMMARY: Final = "summary.json"
# Every file the drainer owns: nothing written from the directory (an export, a report) may
# replace one of them.
OWN_FILES: Final = (*FILES.values(), RUN_MARKER, SUMMARY)


def whole_lines_end(f: BinaryIO, size: int) -> int:
    """The end of the last newline at or before `size` in `f`: what follows it is a torn line
    (a crash mid-write). Read backwards in 64 KiB chunks, so a huge file costs one chunk."""
    chunk = 1 << 16
    pos = size
    while pos > 0:
        start = max(0, pos - chunk)
        f.seek(start)
        data = f.read(pos - start)
        newline = data.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        pos = start
    return 0


def temp_name(path: Path) -> Path:
    """Where `atomic_file` writes `path` before the rename: hidden, and per process, so two
    exports to one path never write the same temporary file."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file that appears at `path` whole, when the block ends without an exception: written
    beside it under a temporary name, fsynced, renamed over it, then the directory fsynced (so
    the rename itself survives a power cut). A crash before the rename leaves `path` as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        with tmp.open("wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as error:
        full = diskfull.from_os_error(error, path)
        if full is None:
            raise
        raise full from None
    finally:
        tmp.unlink(missing_ok=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def usable_dir(path: Path) -> list[Path]:
    """Create `path` if need be and prove a file can be written in it: ConfigError, one line
    naming it and the cause (a file in the way, no permission, a read-only disk), before any
    process is started or any row sent. Returns the directories it created, innermost first
    (for `remove_if_empty` when the command stops before writing anything there)."""
    made = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fleetgen-probe-"):
            pass
    except OSError as error:
        cause = error.strerror or type(error).__name__
        raise ConfigError(f"cannot write in {path}: {cause}; pick another --out") from None
    return made


def remove_if_empty(made: list[Path]) -> None:
    """The directories `usable_dir` created, removed where nothing was written in them: a
    command refused before its start leaves no empty --out behind."""
    for directory in made:  # innermost first: a parent is empty once its child is gone
        try:
            directory.rmdir()
        except OSError:  # not empty (or gone): it stays, and so do its parents
            return


class OutputDir:
    """The directory `fleetgen drain --out` writes, as its one writer sees it: its files'
    names and the drainer's writes. Reading names and the summary is free for anyone; the
    writing methods are the drainer's, the only writer of these files. (A finished run read
    back for export or the report is fleetgen/exporter/source.py `DrainedRun`.)"""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Unbuffered: a write the disk refuses leaves no bytes in a buffer that closing the
        # file would try to write again behind the drainer's back.
        self._appends: dict[str, BinaryIO] = {}

    # -- names ---------------------------------------------------------------------------
    def file(self, kind: str) -> Path:
        """The JSONL file of one outcome kind."""
        return self.path / FILES[kind]

    @property
    def marker(self) -> Path:
        return self.path / RUN_MARKER

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    def own_files(self) -> list[Path]:
        return [self.path / name for name in OWN_FILES]

    def owner(self) -> str | None:
        """The run this directory holds, by its marker; None if it was never claimed."""
        return self.marker.read_text(encoding="utf-8").strip() if self.marker.exists() else None

    def read_summary(self) -> dict[str, Any] | None:
        """summary.json as written; None if there is none. orjson.JSONDecodeError if damaged."""
        if not self.summary_path.exists():
            return None
        loaded = orjson.loads(self.summary_path.read_bytes())
        return loaded if isinstance(loaded, dict) else None

    # -- the drainer's writes ------------------------------------------------------------
    def claim(self, run: str) -> None:
        """Tie the directory to `run` (creating it if need be): one directory holds one run,
        as mixing two would break exactly-once. ConfigError if it holds another run's files.
        Leftovers of a crash inside `replace` (temporary files of ours) are removed."""
        usable_dir(self.path)
        owner = self.owner()
        if owner is not None and owner != run:
            raise ConfigError(f"{self.path} holds the output of run {owner!r}, not {run!r}; "
                              "pick another --out")
        if owner is None and any(self.file(kind).exists() for kind in FILES):
            raise ConfigError(f"{self.path} already holds output files of an unknown run; "
                              "pick another --out")
        for name in OWN_FILES:
            for stale in self.path.glob(f".{name}.tmp-*"):
                stale.unlink(missing_ok=True)
        if owner is None:
            with atomic_file(self.marker) as f:
                f.write(run.encode() + b"\n")

    def repair(self, kind: str) -> int:
        """Cut a torn last line (no trailing newline) left by a crash mid-append, durably;
        returns the bytes removed."""
        path = self.file(kind)
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

    def open_appends(self) -> None:
        """Open every outcome file for appending (creating it): `append` writes to these (and
        opens the holdout's at its first line)."""
        for kind in ALWAYS:
            if kind not in self._appends:
                self._appends[kind] = self._open_append(kind)

    def _open_append(self, kind: str) -> BinaryIO:
        return self.file(kind).open("ab", buffering=0)

    def append(self, kind: str, lines: Iterable[bytes]) -> None:
        """Append whole lines (each without its newline) to `kind`'s file, then fsync: when
        this returns they survive a crash, so the caller may ack them. A full disk (or the
        file-size limit) is a DiskFull, with the file cut back to its whole lines before."""
        f = self._appends.get(kind) or self._appends.setdefault(kind, self._open_append(kind))
        data = memoryview(b"".join(line + b"\n" for line in lines))
        before = os.fstat(f.fileno()).st_size
        try:
            while data:
                data = data[os.write(f.fileno(), data):]
            os.fsync(f.fileno())
        except OSError as error:
            full = diskfull.from_os_error(error, self.file(kind))
            if full is None:
                raise
            os.ftruncate(f.fileno(), before)  # frees what the disk took: never a torn line
            raise full from None

    def replace(self, kind: str, lines: Iterable[bytes]) -> None:
        """Rewrite `kind`'s file to hold exactly `lines` (each with its newline), atomically:
        a crash leaves the old file or the new one, never a mix. An open append handle follows
        the new file."""
        appending = self._appends.pop(kind, None)
        if appending is not None:
            appending.close()
        with atomic_file(self.file(kind)) as f:
            f.writelines(lines)
        if appending is not None:
            self._appends[kind] = self.file(kind).open("ab", buffering=0)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """summary.json, replaced atomically and fsynced like every other file of the run."""
        with atomic_file(self.summary_path) as f:
            f.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")

    def close(self) -> None:
        for f in self._appends.values():
            f.close()
        self._appends.clear()

