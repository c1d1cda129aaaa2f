"""Which files an INPUT names (one file, a directory, a glob), in a stable order, and how each
is read as a stream: JSONL plain, gzip, zstd, bzip2 or xz (known by the file's first bytes,
whatever its name), line by line, or Parquet."""

from __future__ import annotations

import bz2
import functools
import glob
import gzip
import io
import lzma
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from fleetgen.errors import InputError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bzip2", ".xz": "xz"}
# Read as JSONL these would give one invalid_json rejection per line: refuse the file instead.
UNSUPPORTED_COMPRESSIONS = (".lzma", ".lz4", ".zip", ".tar", ".tgz", ".7z", ".br", ".snappy")
KNOWN = "*.jsonl, *.json, *.ndjson (each also .gz, .zst, .bz2, .xz), *.parquet, *.pq"
CHUNK_BYTES = 1 << 20
# A file's first bytes say how it is compressed, whatever its name (a gzip file named .jsonl
# read as text would be a few invalid_utf8 rejections and a run called complete).
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"),
         (b"\xfd7zXZ\x00", "xz"))
UNREADABLE_MAGIC = ((b"PK\x03\x04", "zip"), (b"\x04\x22\x4d\x18", "lz4"),
                    (b"7z\xbc\xaf\x27\x1c", "7z"), (b"\xff\x06\x00\x00sNaPpY", "snappy"))
MAGIC_BYTES = 10

# What a damaged or truncated file raises while it is decompressed or read.
READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)


class Held:
    """The file a look at its first bytes opened, kept for the first read of it: a fresh run
    opens its input once (tests/producer/test_input_read_once.py). Only a single file named
    on its own is held (a directory of thousands would hold as many descriptors)."""

    def __init__(self, raw: io.FileIO | None = None) -> None:
        self._raw = raw
        self.parquet: Any = None  # a Parquet file's reader, opened on this handle once

    def keep(self, parquet: Any) -> None:
        """The Parquet reader opened on the held handle (its footer read): the pass uses it."""
        self.parquet = parquet

    def take(self) -> io.FileIO | None:
        """The handle, rewound, once; None after (or if nothing was held)."""
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.seek(0)
        return raw

    def __del__(self) -> None:
        # Never read (a caller that only resolved the input): closed quietly.
        if self._raw is not None:
            self._raw.close()


class Meter:
    """How far a pass has read the input's files, in their bytes on disk (compressed bytes
    for a compressed file): progress and its ETA before the rows are counted."""

    def __init__(self) -> None:
        self.finished_bytes = 0  # the files read to their end
        self._reading: io.FileIO | None = None

    @property
    def bytes_read(self) -> int:
        raw = self._reading
        return self.finished_bytes + (raw.tell() if raw is not None and not raw.closed else 0)

    def start(self, raw: io.FileIO) -> None:
        self._reading = raw

    def finish(self, raw: io.FileIO) -> None:
        self.add(raw.tell() if not raw.closed else 0)
        self._reading = None

    def add(self, size_bytes: int) -> None:
        """A file read whole (a Parquet file, read by its row groups)."""
        self.finished_bytes += size_bytes


@dataclass(frozen=True)
class InputFile:
    path: Path
    name: str  # relative to the input's directory (or the glob's fixed part): what rows cite
    format: str  # "jsonl" | "parquet"
    compression: str | None  # "gzip" | "zstd" | "bzip2" | "xz" | None
    held: Held = field(default_factory=Held, compare=False, repr=False)

    def open_raw(self) -> io.FileIO:
        """The file on disk, unbuffered: the handle its first bytes were read from if it is
        still held, else a new one."""
        return self.held.take() or io.FileIO(self.path, "rb")


@dataclass(frozen=True)
class Inputs:
    """The files of one INPUT, in reading order. `several`: INPUT is a directory or a glob,
    so each row names its file (even when it matched only one)."""

    files: tuple[InputFile, ...]
    several: bool
    meter: Meter = field(default_factory=Meter, compare=False, repr=False)

    @property
    def names(self) -> list[str]:
        """What the run's manifest pins: a resume must see the same list."""
        return [f.name for f in self.files]

    def size_bytes(self) -> int:
        """The files' sizes on disk, summed: a finished run whose input grew (rows appended to
        a file) is read again rather than called complete."""
        return sum(f.path.stat().st_size for f in self.files)


def resolve_input(spec: Path | str | Inputs) -> Inputs:
    """The files INPUT names; InputError (one line) when there are none."""
    if isinstance(spec, Inputs):
        return spec
    path = Path(spec)
    if path.is_file():
        return Inputs((_input_file(path, path.name, hold=True),), several=False)
    if path.is_dir():
        found = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
        files = _known(found, path)
        if not files:
            raise InputError(f"no input files in directory {path} (it reads {KNOWN}; "
                             f"subdirectories are not read: use a glob such as "
                             f"'{path}/**/*.jsonl')")
        return Inputs(files, several=True)
    if glob.has_magic(str(spec)):
        matched = [Path(p) for p in glob.glob(str(spec), recursive=True) if Path(p).is_file()]
        files = _known(matched, _glob_base(str(spec)))
        if not files:
            also = f"; {len(matched)} files matched, none of them {KNOWN}" if matched else ""
            raise InputError(f"no input files match {spec}{also}")
        return Inputs(files, several=True)
    raise InputError(f"input file not found: {path}")


def _known(paths: list[Path], base: Path) -> tuple[InputFile, ...]:
    """The input files among `paths`, sorted by their name relative to `base` (code-point
    order, as `LC_ALL=C ls` lists them: part-10 before part-9 unless the numbers are padded)."""
    named = sorted((Path(os.path.relpath(p, base)).as_posix(), p) for p in paths)
    return tuple(_input_file(p, name) for name, p in named if _looks_like_input(p))


def _glob_base(pattern: str) -> Path:
    """The directory part of a glob before its first wildcard."""
    fixed: list[str] = []
    for part in Path(pattern).parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def _looks_like_input(path: Path) -> bool:
    """In a directory or a glob: a JSONL or Parquet name, compressed or not (a compression
    fleetgen cannot read is then refused, not skipped)."""
    lower = path.name.lower()
    for suffix in (*COMPRESSIONS, *UNSUPPORTED_COMPRESSIONS):
        lower = lower.removesuffix(suffix)
    return lower.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES)


def _input_file(path: Path, name: str, hold: bool = False) -> InputFile:
    """How to read `path`: Parquet by its suffix, else JSONL, compressed as its first bytes
    say (else as its suffix says, so a .gz that is not gzip is refused as damaged). One file
    named on its own is read as JSONL whatever its suffix (prompts.txt). `hold`: keep the
    handle its first bytes were read from, for the first read."""
    lower = path.name.lower()
    held = Held()
    if hold:
        raw = _open_raw(path)
        sniffed, held = _compression_of(path, raw.read(MAGIC_BYTES)), Held(raw)
    else:
        sniffed = sniff_compression(path)
    unsupported = next((s for s in UNSUPPORTED_COMPRESSIONS if lower.endswith(s)), None)
    if unsupported and sniffed is None:
        raise InputError(f"cannot read {path}: {unsupported} is not supported (fleetgen reads "
                         f"JSONL plain, gzip, zstd, bzip2 or xz, and Parquet)")
    named = next((c for s, c in COMPRESSIONS.items() if lower.endswith(s)), None)
    inner = lower.rsplit(".", 1)[0] if named else lower
    if inner.endswith(PARQUET_SUFFIXES):
        if named or sniffed:
            raise InputError(f"cannot read {path}: Parquet compresses its own pages; give the "
                             f"Parquet file itself")
        return InputFile(path, name, "parquet", None, held)
    return InputFile(path, name, "jsonl", sniffed or named, held)


def sniff_compression(path: Path) -> str | None:
    """The compression `path`'s first bytes show (None: none fleetgen knows of); InputError
    for one it cannot read, naming it."""
    stat = path.stat()
    return _sniff(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _sniff(path: Path, _size: int, _mtime_ns: int) -> str | None:
    with _open_raw(path) as f:
        return _compression_of(path, f.read(MAGIC_BYTES))


def _open_raw(path: Path) -> io.FileIO:
    try:
        return io.FileIO(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None


def _compression_of(path: Path, head: bytes) -> str | None:
    for magic, name in UNREADABLE_MAGIC:
        if head.startswith(magic):
            raise InputError(f"cannot read {path}: it is {name}-compressed, which fleetgen "
                             f"does not read; decompress it (fleetgen reads JSONL plain, "
                             f"gzip, zstd, bzip2 or xz, and Parquet)")
    return next((name for magic, name in MAGIC if head.startswith(magic)), None)


# -- JSONL streams ----------------------------------------------------------------------------
def iter_lines(file: InputFile, meter: Meter | None = None) -> Iterator[bytes]:
    """The file's lines (with their newline), decompressed as they are read; a damaged or
    truncated file is an InputError naming the file and the last line read. `meter` follows
    how far the file on disk has been read."""
    line = 0
    meter = meter or Meter()
    try:
        with file.open_raw() as disk, _open(file, disk) as f:
            meter.start(disk)
            for raw in f:
                line += 1
                yield raw
            meter.finish(disk)
    except READ_ERRORS as exc:
        raise _damaged(file, f"after line {line}", exc) from exc


def _damaged(file: InputFile, where: str, exc: BaseException) -> InputError:
    if isinstance(exc, OSError) and exc.errno is not None:  # the file system said no
        return InputError(f"cannot read {file.path} {where}: {exc.strerror}")
    what = f"{file.compression} data" if file.compression else "file"
    return InputError(f"cannot read {file.path}: {what} damaged or truncated {where}: "
                      f"{exc or type(exc).__name__}")


def _open(file: InputFile, disk: io.FileIO) -> io.BufferedIOBase:
    """`disk` (the file's own handle, which the caller closes) as a stream of its lines'
    bytes, decompressed."""
    if file.compression == "gzip":
        return gzip.GzipFile(fileobj=disk, mode="rb")  # buffered by itself
    if file.compression == "zstd":
        return io.BufferedReader(_ZstdReader(disk), CHUNK_BYTES)
    if file.compression == "bzip2":
        return bz2.BZ2File(disk, "rb")  # buffered by itself, as gzip's
    if file.compression == "xz":
        return lzma.LZMAFile(disk, "rb")
    return io.BufferedReader(disk, CHUNK_BYTES)


class _ZstdReader(io.RawIOBase):
    """Frames one after another, like `zstd -d`. zstandard's own stream_reader ends quietly
    at a truncated frame; this one raises, so a cut file is never taken as a short one."""

    def __init__(self, disk: io.FileIO) -> None:
        self._file = disk
        self._dctx = zstandard.ZstdDecompressor()
        self._chunks = self._decompress()
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _decompress(self) -> Iterator[bytes]:
        dobj, fed = self._dctx.decompressobj(), False
        while data := self._file.read(CHUNK_BYTES):
            while data:
                fed = True
                if out := dobj.decompress(data):
                    yield out
                data = b""
                if dobj.eof:  # the frame ended inside this chunk: the rest is the next one
                    data, dobj, fed = dobj.unused_data, self._dctx.decompressobj(), False
        if fed and not dobj.eof:
            raise EOFError("the last zstd frame is incomplete")

    def close(self) -> None:
        self._file.close()
        super().close()
