"""`fleetgen purge`: delete a finished run's keys from Redis (its output files stay).

Removes the run's manifest, bitmaps, counters, stream and retry data from Redis. The output
files are not touched. A run that is not complete is kept unless --force: purging it loses its
resume state, and its tasks still queued or held by workers are removed too.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetgen import exitcodes
from fleetgen.cli.flags import redis_option, subcommand
from fleetgen.errors import ConfigError
from fleetgen.queue.redisconn import connect, redis_url
from fleetgen.queue.wire import remove_tasks
from fleetgen.runstate import lifecycle


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "purge", "delete a finished run's keys from Redis", __doc__, run)
    p.add_argument("--run", required=True, metavar="NAME",
                   help="the run to delete from Redis (its name, as "
                   "`fleetgen status` lists it)")
    redis_option(p, metavar="URL")
    p.add_argument("--force", action="store_true", help="purge even an incomplete run")


def run(args: argparse.Namespace) -> int:
    client = connect(redis_url(args.redis))
    if not lifecycle.exists(client, args.run):
        raise ConfigError(f"no run named {args.run!r} in this Redis")
    if not lifecycle.run_complete(client, args.run) and not args.force:
        raise ConfigError(f"run {args.run!r} is not complete; purging it loses what a resume "
                          "needs (use --force if that is what you want)")
    # Keys first: a worker that takes one of the run's tasks from now on finds no manifest
    # and drops it (workers/sink.py); then the tasks still queued or held unacked.
    removed = lifecycle.purge(client, args.run)
    queued, unacked = remove_tasks(client, args.run)
    print(f"fleetgen purge: run {args.run!r}: {removed} key(s) deleted, {queued} queued and "
          f"{unacked} unacked task(s) removed")
    return exitcodes.OK
