"""`fleetgen status`: counts, rates and ETA of a run, once, live (--watch) or as JSON.

Totals, queue depth, in-flight prompts, truncation rate, ETA and a row per worker (done, in
flight, rows/s, tokens/s, health), read from Redis alone. With --watch the table refreshes and
rates are measured between refreshes; --json --watch prints one JSON object per line.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from fleetgen import exitcodes
from fleetgen.cli.flags import redis_option, subcommand
from fleetgen.cli.signals import sigterm_flag
from fleetgen.errors import ConfigError
from fleetgen.monitor import status
from fleetgen.queue.redisconn import connect, redis_url, text
from fleetgen.runstate.keys import runs_index_key


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "status", "show a run's progress, rates and ETA", __doc__, run)
    p.add_argument("--run", help="run name (default: list the runs)")
    redis_option(p)
    p.add_argument("--watch", action="store_true", help="refresh until interrupted")
    p.add_argument("--interval", type=float, default=2.0, help="--watch refresh in s (2)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--serve", metavar="[HOST:]PORT",
                   help="serve a live page of the run (progress, ETA, rates over the last "
                   "minutes, per-worker throughput, queue depth, shares, early stop), "
                   "refreshing by itself every --interval; bound to 127.0.0.1 unless HOST is "
                   "given (PORT 0: any free one, printed); read-only, behind basic auth: "
                   "user:password from $FLEETGEN_STATUS_AUTH, else generated and printed; "
                   "until Ctrl-C")


def run(args: argparse.Namespace) -> int:
    client = connect(redis_url(args.redis))
    if args.serve and not args.run:
        raise ConfigError("--serve needs --run NAME: the page shows one run")
    if not args.run:
        runs = sorted(text(r) for r in client.smembers(runs_index_key()))
        print("\n".join(runs) if runs else "no runs")
        return exitcodes.OK
    if args.interval <= 0:
        raise ConfigError(f"--interval must be positive, got {args.interval}")
    if args.serve:
        return serve(client, args.run, args.serve, args.interval)
    # SIGTERM ends --watch between two refreshes (exit 0); one blocked on an unreachable
    # Redis is interrupted (exit 130, see sigterm_flag).
    should_stop = sigterm_flag()
    previous: status.RunStatus | None = None
    clear = args.watch and not args.json and sys.stdout.isatty()
    while not should_stop():
        s = status.gather(client, args.run)
        if s is None and not args.watch:
            raise ConfigError(f"no run named {args.run!r} in this Redis")
        if s is None:
            # --watch may be started before the producer; it shows the run once it exists.
            out = "" if args.json else f"run {args.run}: not started yet (waiting)"
        else:
            s = status.with_window(s, previous)
            out = status.dumps(s, compact=args.watch) if args.json else status.render(s)
        if clear:
            sys.stdout.write("\x1b[H\x1b[2J")
        if out:
            print(out, flush=True)
        if not args.watch:
            return exitcodes.OK
        previous = s
        _pause(args.interval, should_stop)
    return exitcodes.OK


def serve(client: Any, run_name: str, listen: str, interval_s: float) -> int:
    from fleetgen.monitor.live import ENV_AUTH, LivePage, credentials_from_env, parse_listen

    host, port = parse_listen(listen)
    credentials, generated = credentials_from_env()
    try:
        live = LivePage(client, run_name, credentials, host, port, interval_s).start()
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another "
                          "--serve [HOST:]PORT") from None
    # A generated password is shown once, so the user can log in; one from the environment
    # is the user's own and is not echoed.
    login = (f"user {credentials.user}, password {credentials.password}" if generated else
             f"user {credentials.user}, password from ${ENV_AUTH}")
    print(f"fleetgen status: live page of run {run_name!r} at {live.url} ({login}); Ctrl-C to "
          "stop", flush=True)
    should_stop = sigterm_flag()
    try:
        while not should_stop():
            time.sleep(0.1)  # the poll period of the SIGTERM flag
    finally:
        live.stop()
    return exitcodes.OK


def _pause(seconds: float, should_stop: Callable[[], bool]) -> None:
    """The refresh period itself (not a synchronisation), cut short by SIGTERM."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not should_stop():
        time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
