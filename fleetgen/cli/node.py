"""`fleetgen node`: another host (or Slurm node) joins a run: its own engines, started, kept
and stopped as `fleetgen run --engine-cmd` does, and a worker on each, on the run's Redis.

Starts one engine per GPU group from --engine-cmd (CUDA_VISIBLE_DEVICES set; --gpus defaults
to what the host or the Slurm allocation makes visible) and a Celery worker on each once its
engine is ready, all on the run's Redis (--redis or $FLEETGEN_REDIS_URL: the line `fleetgen run
--listen` prints). Exits 0, its engines stopped, once the run is complete (the run announces
that its Redis closes); Ctrl-C or SIGTERM stops everything it started (exit 130).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from fleetgen import exitcodes
from fleetgen.cli.engineflags import add_engine_options, engine_plan
from fleetgen.cli.flags import redis_option, subcommand
from fleetgen.cli.job import STOP_GRACE_S, WORKERS_READY_S
from fleetgen.cli.signals import shield_from_signals, sigterm_flag
from fleetgen.errors import ConfigError
from fleetgen.local.engines import publish
from fleetgen.local.fleet import FleetSpec, LocalFleet
from fleetgen.queue.closing import closing
from fleetgen.queue.contract import closing_key
from fleetgen.queue.redisconn import connect, redact, redis_url

DEFAULT_DIR = Path(".fleetgen-node")
LOOK_S = 1.0  # how often the node looks for the run's end and writes its engines
# A Redis gone this long is a run that is over or was cancelled: the node stops.
REDIS_GONE_S = 120.0


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "node", "join a run from another host: its engines and a worker each",
                   __doc__, run)
    redis_option(p, "the run's Redis (default: $FLEETGEN_REDIS_URL), as `fleetgen run "
                 "--listen` prints it", metavar="URL")
    p.add_argument("--run", metavar="NAME",
                   help="the run joined, so `fleetgen status` shows this node's engines")
    p.add_argument("--dir", type=Path, metavar="DIR",
                   help="the engines' and workers' logs (default: .fleetgen-node/NODE, NODE "
                   "the Slurm node name where there is one, else the host name)")
    add_engine_options(p, required=True)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run(args: argparse.Namespace) -> int:
    plan = engine_plan(args)
    assert plan is not None  # --engine-cmd is required
    url = redis_url(args.redis)
    connect(url).ping()  # an unreachable Redis is one line (exit 4) before anything starts
    name = node_name()

    def say(text: str) -> None:
        print(f"fleetgen node {name}: {text}", flush=True)

    directory = args.dir or DEFAULT_DIR / name
    should_stop = sigterm_flag(grace_s=STOP_GRACE_S, signums=(signal.SIGTERM, signal.SIGINT))
    fleet = LocalFleet(directory, FleetSpec(redis_url=url, worker_prefix=f"{name}-",
                                               workers_die_with_parent=True))
    fleet.with_engines(plan.engine_set(directory / "engines"))
    try:
        say(f"joining the run on {redact(url)}: {fleet.spec.gpus} engine(s), logs in "
            f"{directory}")
        fleet.start(timeout_s=WORKERS_READY_S["run"], say=say)
        say(f"{len(fleet.worker_names())} worker(s) online; this node stops once the run "
            "is complete")
        code = serve(fleet, args.run, should_stop, say)
    finally:
        shield_from_signals()
        fleet.stop_processes(grace_s=0.5 if should_stop() else 15.0)
    if should_stop():
        say("stopped; its engines and workers with it")
        return exitcodes.INTERRUPTED
    return code


def serve(fleet: LocalFleet, run_name: str | None, should_stop: Callable[[], bool],
          say: Callable[[str], None]) -> int:
    """Until the run announces its end (exit 0), every worker is gone, or its Redis is."""
    client = connect(fleet.redis_url)
    assert fleet.engines is not None
    gone_since: float | None = None
    while not should_stop():
        try:
            ended = closing(client.get(closing_key()))
            if run_name is not None:
                publish(client, run_name, fleet.engines.views())
            gone_since = None
        except redis.ConnectionError:
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > REDIS_GONE_S:
                say(f"the run's Redis has not answered for {REDIS_GONE_S:g} s; stopping")
                return exitcodes.UNAVAILABLE
            ended = None
        if ended is not None:
            say(f"run {ended} is complete; stopping its engines")
            return exitcodes.OK
        if not any(w.alive() for w in fleet.workers):
            raise ConfigError("every worker of this node exited; their logs are in "
                              f"{fleet.procs.log_dir}")
        time.sleep(LOOK_S)  # the period of the look, not a synchronisation
    return exitcodes.INTERRUPTED
