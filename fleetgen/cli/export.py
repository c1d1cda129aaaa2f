"""`fleetgen export`: convert a drained output directory for training or batch tools.

Reads what `fleetgen drain` wrote to DIR (never Redis: a purged run exports too) and writes one
file, in input order, whole or not at all. conversations: one line per answer as SpecForge's
train_data_path reads it, a `conversations` column of {role, content} turns (ShareGPT from/value
turned into role/content) ending in the answer, its reasoning in reasoning_content, the template
options it was rendered with (chat_template_kwargs, and each as a column, which SpecForge hands
to the chat template), thinking, status 'success'; a raw prompt as prompt and completion with no
conversation (no trainer wraps it in a chat turn); with --turns all one line per regenerated
turn. openai-batch: one line per input line as OpenAI's Batch API and vLLM's batch runner write
them (failures and rejections as error lines). parquet: the results table. tokens: one {id,
input_ids, loss_mask} line per answer (the prompt's ids as sent, then the answer's; loss 0 then
1), exact for drafter trainers (SpecForge prompts_path, vLLM speculators); needs a run produced
with --token-ids. conversations and tokens leave unfinished answers out (counted by reason)
unless --include-unfinished; with --out FILE.parquet they write a Parquet table for datasets or
pandas (SpecForge and speculators read JSONL only). Exit 0; 1 when the run is not complete (what
is written so far is exported); 3 when DIR is not a drained output directory or the run cannot
be exported in that format. docs/training.md has the trainers' commands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fleetgen import exitcodes
from fleetgen.cli.flags import subcommand
from fleetgen.cli.progress import Bar
from fleetgen.records.outdir import SUMMARY


def add_parser(sub: Any) -> None:
    from fleetgen.exporter import FORMATS
    from fleetgen.exporter.shape import REASONING_MODES

    p = subcommand(sub, "export", "convert a drained output directory (conversations, "
                   "OpenAI Batch, Parquet, token ids)", __doc__, run)
    p.add_argument("dir", type=Path, metavar="DIR", help="the directory `fleetgen drain "
                   "--out` wrote")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help=f"what to write: {', '.join(FORMATS)} (each described above)")
    p.add_argument("--out", type=Path, metavar="PATH",
                   help="output file (default: DIR/export.FORMAT.jsonl, or DIR/export.parquet); "
                   "with --format conversations or tokens a PATH ending in .parquet writes the "
                   "same rows as a Parquet table")
    p.add_argument("--reasoning", choices=REASONING_MODES, default="keep",
                   help="a thinking model's reasoning: keep it as a field of its own "
                   "(conversations: reasoning_content; openai-batch: message.reasoning; "
                   "parquet: the reasoning column), inline it before the answer as "
                   "<think>...</think>, or strip it (default: keep)")
    p.add_argument("--model", help="openai-batch: the model named in each body (default: the "
                   f"run's {SUMMARY}, else each Batch line's own, else 'fleetgen')")
    p.add_argument("--only-finished", action="store_true", help="parquet: leave out answers "
                   "that are not whole (cut at their budget, finish_reason length; stopped "
                   "inside their reasoning, reasoning_unfinished; empty), counted by reason in "
                   "the summary line (conversations and tokens do so by default)")
    p.add_argument("--include-unfinished", action="store_true",
                   help="conversations, tokens: keep the answers that are not whole, marked "
                   "(unfinished: the reason; conversations: status 'unfinished'): a trainer "
                   "reading them learns to stop where the model did not")


def run(args: argparse.Namespace) -> int:
    from fleetgen.exporter.export import ExportOptions, export, writes_parquet

    bar = Bar("export", show=sys.stderr.isatty(), unit="B", unit_scale=True)
    try:
        report = export(args.dir, ExportOptions(format=args.format, out=args.out,
                                          reasoning=args.reasoning, model=args.model,
                                          only_finished=args.only_finished,
                                          include_unfinished=args.include_unfinished,
                                          prompt_ids=prompt_ids),
                        progress=bar.add, on_open=bar.set_total)
    finally:
        bar.close()
    unit = "rows" if writes_parquet(args.format, report.out) else "lines"
    print(f"fleetgen export: {report.written} {unit} of run {report.run!r} -> {report.out}"
          f"{_left_out(report.left_out) if report.left_out or args.only_finished else ''}")
    for name, size in report.torn.items():
        print(f"fleetgen export: {name} ends in a torn line ({size} bytes) that a drainer is "
              "writing or was killed writing: not exported; `fleetgen drain` repairs it",
              file=sys.stderr)
    if report.superseded:
        print(f"fleetgen export: {report.superseded} failure(s) superseded by a result of the "
              "same row (left by a drainer killed mid-repair): exported as results",
              file=sys.stderr)
    if not report.complete and report.stopped and not report.torn:
        # Its drain has ended: waiting would change nothing (summary.json `stopped`).
        print(f"fleetgen export: run {report.run!r} was stopped early ({report.stopped}): "
              "exported everything it wrote (the requests sent before the stop); to go on: "
              "the same `fleetgen produce` (or `fleetgen demo`) command plus --ignore-stop, "
              "then export again",
              file=sys.stderr)
        return exitcodes.INCOMPLETE
    if not report.complete:
        why = ("a file ends in a torn line" if report.torn else
               f"{SUMMARY} says so" if report.summarized else f"it has no {SUMMARY}")
        print(f"fleetgen export: run {report.run!r} is not complete ({why}): exported what "
              "is written so far; export again when `fleetgen drain` has finished",
              file=sys.stderr)
        return exitcodes.INCOMPLETE
    return exitcodes.OK


def _left_out(counts: dict[str, int]) -> str:
    """The summary line's tail under --only-finished: how many were left out, and why."""
    from fleetgen.exporter.finished import REASONS

    why = ", ".join(f"{counts[r]} {r}" for r in REASONS if counts.get(r))
    return f"; left out {sum(counts.values())} unfinished" + (f" ({why})" if why else "")


def prompt_ids(settings: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], list[int]]:
    """`--format tokens`: the ids the producer sent for a result's row, rendered again as the
    producer renders it (`producer.pipeline.render_row`: the run's tokenizer and
    chat_template_kwargs, the row's own over them) from the input row's fields that the record
    carries. The exporter may not import the producer (tests/layout/test_layers.py), so it is
    built here, one floor up, and handed over as a callable."""
    from fleetgen.records.outcomes import split_result
    from fleetgen.settings.runoptions import DEFAULT_TOKENIZER
    from producer.prompts import render_row
    from producer.rows import BadRow, parse_row
    from producer.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(settings.get("tokenizer") or DEFAULT_TOKENIZER),
                               chat_template_kwargs=settings.get("chat_template_kwargs") or {})

    def ids(record: Mapping[str, Any]) -> list[int]:
        row = parse_row(int(record["line"]), split_result(record).row)
        if isinstance(row, BadRow):
            raise ValueError(row.reason)
        return tokenizer.encode_batch([render_row(tokenizer, row)])[0]

    return ids

