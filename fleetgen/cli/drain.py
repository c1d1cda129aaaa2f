"""`fleetgen drain`: write a run's outcomes from its stream to JSONL files, exactly once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fleetgen import exitcodes
from fleetgen.cli.flags import redis_option, subcommand
from fleetgen.cli.progress import Bar
from fleetgen.cli.signals import sigterm_flag
from fleetgen.queue.contract import KIND_FAILURE, KIND_REJECTED, KIND_RESULT
from fleetgen.queue.redisconn import connect, redis_url
from fleetgen.records.outdir import FILES, SUMMARY


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "drain", "write a run's results to JSONL files",
                   "Read the run's stream and append whole lines to "
                   f"{FILES[KIND_RESULT]}, {FILES[KIND_FAILURE]} and {FILES[KIND_REJECTED]} "
                   "in --out; exits when every row is written, unless --follow, with a "
                   f"short table of the figures ({SUMMARY} beside the files has them all). "
                   "Shows rows written, rate and ETA (a bar on a terminal, else a line every "
                   "10 s). Safe to kill and restart.", run)
    p.add_argument("--run", required=True, metavar="NAME",
                   help="the run to write (its name, as given to `fleetgen produce --run`)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    redis_option(p)
    p.add_argument("--follow", action="store_true", help="keep running after the run completes")
    p.add_argument("--batch", type=int, default=512, help="entries written per fsync (512)")


def run(args: argparse.Namespace) -> int:
    from fleetgen.cli.runview import FleetView
    from fleetgen.cli.summary import summary_table
    from fleetgen.drainer import Drainer

    client = connect(redis_url(args.redis))
    drainer = Drainer(client, args.run, args.out, batch=args.batch)
    should_stop = sigterm_flag()  # SIGTERM: finish the batch, write the summary, exit
    drainer.recover()
    # Rows written of the run's total: a bar on a terminal, else a line every 10 s.
    bar = Bar("rows written", show=sys.stderr.isatty(),
              lines=f"fleetgen drain: run {args.run!r}: written")

    # A worker that stops beating (dead, or its host cut off from Valkey) and its return are
    # said here too, as `fleetgen run` says them (issue 52).
    view = FleetView(client, args.run, [], lambda text: bar.note(f"fleetgen drain: {text}"))

    try:
        for _ in drainer.ticks(follow=args.follow, should_stop=should_stop):
            bar.advance_to(drainer.tally.written, drainer.manifest().rows)
            view.look()
    finally:
        drainer.close()
        bar.close()
    summary = drainer.write_summary()
    # The figures that matter, short; every figure is in summary.json beside the files.
    print(summary_table(summary, args.out))
    if summary.get("stopped"):
        print(f"fleetgen drain: run {args.run!r} was stopped early: {summary['stopped']}; "
              "everything sent before the stop is written", file=sys.stderr)
    return exitcodes.OK if summary["complete"] or args.follow else exitcodes.INCOMPLETE

