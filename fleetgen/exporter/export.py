"""One export: a drained output directory in, one file out (written whole or not at all)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from fleetgen.errors import ConfigError
from fleetgen.exporter import FORMATS, conversations, openai_batch, parquet, tokens
from fleetgen.exporter.finished import Selection
from fleetgen.exporter.shape import REASONING_MODES
from fleetgen.exporter.source import KINDS, DrainedRun
from fleetgen.queue.contract import KIND_RESULT
from fleetgen.records.outdir import OutputDir, atomic_file


@dataclass(frozen=True)
class ExportOptions:
    format: str
    out: Path | None = None  # default: DIR/export.<format>.jsonl (.parquet)
    reasoning: str = "keep"
    model: str | None = None  # openai-batch: the body's model, over the run's own
    only_finished: bool = False  # leave out answers cut at length or inside their reasoning
    include_unfinished: bool = False  # conversations, tokens: keep them (marked), not left out
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
    left_out: dict[str, int] = field(default_factory=dict)  # --only-finished: reason -> count
    stopped: str | None = None  # why --stop-if stopped the run (summary.json `stopped`)


# Formats with a Parquet twin: `--out` ending in `.parquet` writes the same rows as a table.
PARQUET_TWINS = ("conversations", "tokens")
PARQUET_SUFFIX = ".parquet"
# Formats --only-finished applies to: one row per answer. openai-batch has one line per input
# line, errors included, so leaving answers out would break that.
FILTERABLE = ("conversations", "parquet", "tokens")
# The training formats: unfinished answers left out unless --include-unfinished keeps them.
TRAINING = ("conversations", "tokens")


def default_out(directory: Path, fmt: str) -> Path:
    return directory / ("export.parquet" if fmt == "parquet" else f"export.{fmt}.jsonl")


def writes_parquet(fmt: str, out: Path) -> bool:
    """Whether this export is a Parquet file: `--format parquet`, or a format with a Parquet
    twin written to a path ending in `.parquet`."""
    return fmt == "parquet" or (fmt in PARQUET_TWINS and out.suffix == PARQUET_SUFFIX)


def export(directory: Path, options: ExportOptions,
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
    if options.only_finished and options.format not in FILTERABLE:
        raise ConfigError(f"--only-finished does not apply to --format {options.format} (one "
                          "line per input line, errors too); filter on finish_reason instead, "
                          f"or pick one of {', '.join(FILTERABLE)}")
    if options.include_unfinished and options.format not in TRAINING:
        raise ConfigError(f"--include-unfinished applies to --format {' and '.join(TRAINING)} "
                          f"(which leave unfinished answers out by default); --format "
                          f"{options.format} keeps every answer")
    if options.include_unfinished and options.only_finished:
        raise ConfigError("--include-unfinished and --only-finished contradict each other; "
                          "pick one")
    out = options.out or default_out(directory, options.format)
    selection = Selection(options.only_finished or (options.format in TRAINING
                                                    and not options.include_unfinished))
    with DrainedRun(directory, progress) as source:
        refuse_drainer_files(directory, out)
        _refuse_turns(source, options, out)
        prompt_ids = _prompt_ids(source, options)  # tokens: refused before anything is written
        on_open(2 * source.size(KINDS if options.format == "openai-batch" else (KIND_RESULT,)))
        with atomic_file(out) as f:
            written, superseded = _write(source, f, options, out, selection, prompt_ids)
        info = source.info
        return Report(out, written, info.run, info.complete and not source.torn,
                      info.summary is not None, source.torn, superseded,
                      dict(selection.left_out), info.stopped)


def _write(source: DrainedRun, f: BinaryIO, options: ExportOptions, out: Path,
           selection: Selection, prompt_ids: tokens.PromptIds | None = None
           ) -> tuple[int, int]:
    if options.format == "conversations":
        write = (conversations.write_parquet if writes_parquet(options.format, out)
                 else conversations.write)
        return write(source, f, options.reasoning, selection)
    if options.format == "parquet":
        return parquet.write(source, f, options.reasoning, selection)
    if prompt_ids is not None:
        return tokens.write(source, f, prompt_ids, writes_parquet(options.format, out),
                            selection)
    ctx = openai_batch.Context(run=source.info.run, created=source.info.created,
                               model=options.model or source.info.model,
                               reasoning=options.reasoning)
    return openai_batch.write(source, f, ctx)


def _refuse_turns(source: DrainedRun, options: ExportOptions, out: Path) -> None:
    """openai-batch has one response per request line; a `--turns all` conversation is several
    requests, each built on the answer before it, which no Batch input line asked for."""
    settings = (source.info.summary or {}).get("settings") or {}
    if settings.get("turns") != "all":
        return
    if options.format == "openai-batch":
        raise ConfigError(f"run {source.info.run!r} regenerated every turn (--turns all): "
                          "OpenAI Batch output has one response per request line, and these "
                          "turns were requests of fleetgen's own; export --format "
                          "conversations (whole conversations) or tokens (one line per turn)")
    if options.format == "conversations" and writes_parquet(options.format, out):
        raise ConfigError("--format conversations of a --turns all run is written as JSONL "
                          "only for now; give --out a .jsonl name")


def _prompt_ids(source: DrainedRun, options: ExportOptions) -> tokens.PromptIds | None:
    if options.format != "tokens":
        return None
    settings = (source.info.summary or {}).get("settings")
    return tokens.prompt_ids_for(settings, source.info.run, options.prompt_ids)


def refuse_drainer_files(directory: Path, out: Path) -> None:
    """A file written from an output directory (an export, a report) may not replace one of
    the drainer's own files, nor be a directory."""
    ours = {path.resolve() for path in OutputDir(directory).own_files()}
    if out.resolve() in ours:
        raise ConfigError(f"--out {out} is one of the drainer's own files; pick another path")
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file path")
