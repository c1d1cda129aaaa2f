"""One export: a drained output directory in, one file out (written whole or not at all)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from exporter import FORMATS, conversations, openai_batch, parquet, tokens
from exporter.shape import REASONING_MODES
from exporter.source import KINDS, OutputDir
from fleetgen.base.contract import KIND_RESULT
from fleetgen.base.errors import ConfigError
from fleetgen.base.outdir import FILES, RUN_MARKER, SUMMARY


@dataclass(frozen=True)
class Options:
    format: str
    out: Path | None = None  # default: DIR/export.<format>.jsonl (.parquet)
    reasoning: str = "keep"
    model: str | None = None  # openai-batch: the body's model, over the run's own
    prompt_ids: tokens.PromptIdsFactory | None = None  # tokens: re-renders a row's prompt ids


@dataclass(frozen=True)
class Report:
    out: Path
    written: int  # lines (rows, for parquet)
    run: str
    complete: bool  # the run was complete by its summary.json and no file had a torn tail
    summarized: bool  # the directory has a summary.json
    torn: dict[str, int]  # file -> bytes of a torn last line, not exported
    superseded: int  # outcomes hidden by a better one for the same row and sample


def default_out(directory: Path, fmt: str) -> Path:
    return directory / ("export.parquet" if fmt == "parquet" else f"export.{fmt}.jsonl")


def is_parquet(options: Options, out: Path) -> bool:
    """Parquet: the `parquet` format, or `tokens` to a path ending in .parquet."""
    return options.format == "parquet" or (options.format == "tokens"
                                           and out.suffix == tokens.PARQUET_SUFFIX)


def export(directory: Path, options: Options,
           progress: Callable[[int], None] = lambda nbytes: None,
           on_open: Callable[[int], None] = lambda total: None) -> Report:
    """Write the export. The files are read twice (an index, then the records in input
    order): `on_open` learns the bytes both passes will read, `progress` each step's."""
    if options.format not in FORMATS:
        raise ConfigError(f"unknown format {options.format!r}; pick one of "
                          f"{', '.join(FORMATS)}")
    if options.reasoning not in REASONING_MODES:
        raise ConfigError(f"unknown --reasoning {options.reasoning!r}; pick one of "
                          f"{', '.join(REASONING_MODES)}")
    out = options.out or default_out(directory, options.format)
    with OutputDir(directory, progress) as source:
        _refuse_drainer_files(directory, out)
        prompt_ids = _prompt_ids(source, options)  # tokens: refused before anything is written
        on_open(2 * source.size(KINDS if options.format == "openai-batch" else (KIND_RESULT,)))
        with atomic_file(out) as f:
            written, superseded = _write(source, f, options, out, prompt_ids)
        info = source.info
        return Report(out, written, info.run, info.complete and not source.torn,
                      info.summary is not None, source.torn, superseded)


def _write(source: OutputDir, f: BinaryIO, options: Options, out: Path,
           prompt_ids: tokens.PromptIds | None = None) -> tuple[int, int]:
    if options.format == "conversations":
        return conversations.write(source, f, options.reasoning)
    if options.format == "parquet":
        return parquet.write(source, f, options.reasoning)
    if prompt_ids is not None:
        return tokens.write(source, f, prompt_ids, is_parquet(options, out))
    ctx = openai_batch.Context(run=source.info.run, created=source.info.created,
                               model=options.model or source.info.model,
                               reasoning=options.reasoning)
    return openai_batch.write(source, f, ctx)


def _prompt_ids(source: OutputDir, options: Options) -> tokens.PromptIds | None:
    if options.format != "tokens":
        return None
    settings = (source.info.summary or {}).get("settings")
    return tokens.prompt_ids_for(settings, source.info.run, options.prompt_ids)


def _refuse_drainer_files(directory: Path, out: Path) -> None:
    ours = {(directory / name).resolve() for name in (*FILES.values(), RUN_MARKER, SUMMARY)}
    if out.resolve() in ours:
        raise ConfigError(f"--out {out} is one of the drainer's own files; pick another path")
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file path")


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file that appears at `path` whole, when the block ends without an exception: written
    beside it under a temporary name, fsynced, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        tmp.unlink(missing_ok=True)
