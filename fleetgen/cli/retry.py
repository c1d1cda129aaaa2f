"""`fleetgen retry`: send a run's failed rows back to work; a success moves them to results."""

from __future__ import annotations

import argparse
from typing import Any

from fleetgen import exitcodes
from fleetgen.cli.flags import redis_option, subcommand
from fleetgen.errors import ConfigError
from fleetgen.queue.contract import KIND_FAILURE, KIND_RESULT, slot_of
from fleetgen.queue.redisconn import connect, redis_url
from fleetgen.records.outdir import FILES
from fleetgen.runstate import lifecycle


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "retry", "re-enqueue a run's failed rows",
                   "Sends every failed row of the run back to the workers. A "
                   f"row that now succeeds moves from {FILES[KIND_FAILURE]} to "
                   f"{FILES[KIND_RESULT]} when the drainer writes it (run `fleetgen drain` "
                   "again if it has exited).", run)
    p.add_argument("--run", required=True, metavar="NAME",
                   help="the run whose failed rows to send again (its name, as "
                   "`fleetgen status` lists it)")
    redis_option(p)


def run(args: argparse.Namespace) -> int:
    from producer.enqueue import Enqueuer

    url = redis_url(args.redis)
    client = connect(url)
    if not lifecycle.exists(client, args.run):
        raise ConfigError(f"no run named {args.run!r} in this Redis")
    payloads = lifecycle.failed_payloads(client, args.run)
    if not payloads:
        print(f"fleetgen retry: run {args.run!r} has no failed rows")
        return exitcodes.OK
    # Mark them as in retry before they can run: the drainer does not call the run complete
    # while the set is non-empty, and a worker removes each line when it records its outcome.
    lifecycle.mark_retrying(client, args.run, [slot_of(p) for p in payloads])
    Enqueuer(client, args.run).send(payloads)
    ids = ", ".join(p["id"] for p in payloads[:5])
    more = f" and {len(payloads) - 5} more" if len(payloads) > 5 else ""
    print(f"fleetgen retry: {len(payloads)} failed row(s) of run {args.run!r} re-enqueued "
          f"({ids}{more})")
    if any("turn" in p for p in payloads):
        print("fleetgen retry: a --turns all run: the conversations go on from each retried "
              "turn that succeeds; run the same `fleetgen produce` command (it builds the next "
              "turns) with `fleetgen drain`")
    return exitcodes.OK
