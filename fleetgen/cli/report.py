"""`fleetgen report`: a drained output directory as one self-contained HTML page.

Reads what `fleetgen drain` wrote to DIR (never Redis: a purged run reports too) in one
streaming pass and writes one self-contained HTML file (no CDN, no server: open it from disk):
answer and reasoning lengths with the budget marked, prompt lengths with the rows rejected as
too long, finish reasons, truncation and unfinished-reasoning shares, rows and tokens per
worker, throughput over the run, failures and rejections by kind with examples, the run's
settings, and where the answers carry it the speculative acceptance (pooled and per-request, by
server, thinking, turn, answer length and --group-by FIELD; weak.jsonl beside the page holds the
20 lowest rows as input). Exit 0; 1 when the run is not complete (the report shows what is
written so far); 3 when DIR is not a drained output directory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fleetgen import exitcodes
from fleetgen.cli.flags import subcommand
from fleetgen.records.outdir import SUMMARY


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "report", "the run and its data as pictures: one HTML file that "
                   "works offline", __doc__, run)
    p.add_argument("dir", type=Path, metavar="DIR", help="the directory `fleetgen drain "
                   "--out` wrote")
    p.add_argument("--out", type=Path, metavar="PATH",
                   help="the HTML file (default: DIR/report.html); weak.jsonl beside it")
    p.add_argument("--group-by", metavar="FIELD",
                   help="break the speculative acceptance down by this row field too (e.g. "
                   "source), besides server, thinking, turn and answer length")
    p.add_argument("--paired", type=Path, metavar="OTHER",
                   help="another run of the same input on another drafter: the two pooled "
                   "acceptances on the prompts both answered, and OTHER's minus DIR's with "
                   "its 95 %% interval (an A/B on the same prompts)")


def run(args: argparse.Namespace) -> int:
    from fleetgen.monitor.report import build

    bar = _bar() if sys.stderr.isatty() else None
    try:
        built = build(args.dir, args.out,
                      progress=bar.update if bar is not None else lambda n: None,
                      group_by=args.group_by)
    finally:
        if bar is not None:
            bar.close()
    data = built.data
    print(f"fleetgen report: run {built.read.run!r}, {data['figures']['done']} results, "
          f"{data['figures']['failed']} failures, {data['figures']['rejected']} rejected "
          f"-> {built.out} ({built.size / 1024:.0f} KiB)")
    if built.weak is not None:
        spec = data["spec"]
        print(f"fleetgen report: acceptance {spec['accept_length']} pooled (per-request mean "
              f"{spec['accept_length_mean']}); the {len(spec['lowest_rows'])} lowest answers' "
              f"rows -> {built.weak}")
    if args.paired is not None:
        print(f"fleetgen report: {paired_line(args.dir, args.paired)}")
    for name, size in built.read.torn.items():
        print(f"fleetgen report: {name} ends in a torn line ({size} bytes) that a drainer is "
              "writing or was killed writing: not counted", file=sys.stderr)
    if data["mismatch"]:
        print(f"fleetgen report: {SUMMARY} differs from the files on "
              f"{', '.join(data['mismatch'])}: the report counts the files", file=sys.stderr)
    if not data["complete"]:
        print(f"fleetgen report: run {built.read.run!r} is not complete: the report shows what "
              "is written so far", file=sys.stderr)
        return exitcodes.INCOMPLETE
    return exitcodes.OK


def _bar() -> Any:
    from tqdm import tqdm

    return tqdm(desc="report", unit="B", unit_scale=True, file=sys.stderr, dynamic_ncols=True)


def paired_line(a: Path, b: Path) -> str:
    """The A/B of two runs of one input, each on one drafter: B - A on the same prompts."""
    from fleetgen.cli.paired import paired, steps_by_request
    from fleetgen.exporter.source import DrainedRun
    from fleetgen.queue.contract import KIND_RESULT

    sides = []
    for path in (a, b):
        with DrainedRun(path) as source:
            sides.append(steps_by_request(r for r, _ in source.records(KIND_RESULT)))
    got = paired(*sides)
    if got is None:
        return (f"paired with {b}: fewer than two requests answered with acceptance by both "
                "runs (the same input, by id, sample and turn)")
    low, high = got["difference_ci95"]
    return (f"paired with {b} on the {got['requests']} requests both answered: {a} "
            f"{got['a']:.3f}, {b} {got['b']:.3f} tokens per verify step pooled; difference "
            f"{got['difference']:+.3f} (95 % {low:+.3f} to {high:+.3f}); answered by one run "
            f"only: {got['only_a']} and {got['only_b']}")
