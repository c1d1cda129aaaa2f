"""`fleetgen run`: the whole job on one node against real servers, in one command and resumable:
an embedded Valkey under --out (or --redis), a worker per engine, the producer and the drainer
(fleetgen/cli/job.py, the demo's own path).

Checks every --engine-url as `fleetgen doctor` does, starts a Valkey under --out (AOF on, a
password, loopback only; --redis or $FLEETGEN_REDIS_URL for your own), one Celery worker per
engine (its pool sized from the server: K + 1), the producer and the drainer; shows progress,
prints the summary and writes the report; exit 0 once every row is accounted for. Ctrl-C or
SIGTERM stops it within 2 s; the same command resumes the run recorded in --out.
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetgen.cli import job
from fleetgen.cli.engineflags import EnginePlan, add_engine_options, engine_plan
from fleetgen.cli.flags import engine_protocol_option, redis_option, subcommand
from fleetgen.cli.preflight import preflight
from fleetgen.cli.produce import add_producer_options, settings_from
from fleetgen.errors import ConfigError
from fleetgen.local.fleet import FleetSpec, LocalFleet
from fleetgen.queue.redisconn import redis_url
from fleetgen.records.outdir import OutputDir, remove_if_empty, usable_dir
from fleetgen.settings import envvars, runoptions
from producer.settings import setting_default

if TYPE_CHECKING:
    from fleetgen.cli.nodejob import RunHandle, Step
    from producer.inputs import Inputs

# Beside the output files: the run's Valkey (its AOF) and its URL, kept until the run is
# complete, so the same command resumes the run recorded there.
STATE_DIR = ".fleetgen-state"


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "run", "the whole job on this node, against your servers (resumable)",
                   __doc__, run)
    p.add_argument("input", type=Path, metavar="INPUT",
                   help="prompts, as `fleetgen produce` reads them: a file, a directory or a "
                   "quoted glob")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output dir")
    p.add_argument("--run", metavar="NAME",
                   help="run name (default: the one recorded in --out, else run-TIMESTAMP)")
    add_fleet_options(p, f"a Redis of your own (default: $FLEETGEN_REDIS_URL, else a Valkey "
                      f"under DIR/{STATE_DIR})", engine_url_required=False)
    add_engine_options(p)
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="the embedded Valkey also listens there (with its password), so "
                   "workers on other hosts can join the run; the line they need is printed")
    p.add_argument("--retry-failures", action="store_true",
                   help="send the rows in DIR/failures.jsonl again (also once the run is "
                   "complete): a success moves the row to results.jsonl")
    p.add_argument("--measure-acceptance", action="store_true",
                   help="measure the servers' drafter on these prompts (e.g. holdout.jsonl): "
                   "refuse unless a server speculates, and print at the end the pooled "
                   "acceptance length, the per-request mean and the breakdowns; the report "
                   "and weak.jsonl (the lowest rows) beside it (docs/acceptance.md)")
    p.add_argument("--group-by", metavar="FIELD",
                   help="also break the acceptance down by this row field (e.g. source)")
    p.add_argument("--reuse-estimate", metavar="DIR|none",
                   help="where `fleetgen estimate` wrote (its --out): its sample's answers are "
                   "this run's results, not sent again, where they stand for this run's "
                   "requests (the same prompt, sampling and model, within each row's budget; "
                   "docs/plan.md); none: send every row (default: the working directory "
                   "and --out)")
    add_producer_options(p, runoptions.RUN)


def add_fleet_options(p: argparse.ArgumentParser, redis_help: str,
                      engine_url_required: bool = True) -> None:
    """The servers and how the run's workers reach them: `run`'s, and `estimate`'s for the
    `fleetgen run` of its sample."""
    p.add_argument("--engine-url", action="append", required=engine_url_required, metavar="URL",
                   help="a server (repeat for each, or a comma list; http://HOST:30000-30007 "
                   "for a range of ports); one worker each")
    redis_option(p, redis_help, metavar="URL")
    p.add_argument("--workers-per-engine", type=int, default=1, metavar="N",
                   help="worker processes per engine, sharing its K + 1 slots "
                   "(FLEETGEN_ENGINE_SHARE; for a small model's fast GPU) (1)")
    engine_protocol_option(p)


def listen_address(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen must be HOST:PORT, got {value!r}")
    return host, int(port)


def run_name(out: Path, given: str | None) -> tuple[str, bool]:
    """The run to resume in `out` (its marker, else its summary), or a new one; True when
    resumed. ConfigError when --run names another run than the one `out` holds."""
    outdir = OutputDir(out)
    recorded = outdir.owner() or str((outdir.read_summary() or {}).get("run", "")) or None
    if recorded is not None and given is not None and given != recorded:
        raise ConfigError(f"{out} holds the output of run {recorded!r}, not {given!r}; "
                          "drop --run to resume it, or pick another --out")
    return recorded or given or f"run-{time.strftime('%Y%m%d-%H%M%S')}", recorded is not None


def reuse_from(given: str | None, out: Path) -> tuple[Path, ...]:
    """The directories whose estimate samples the run may reuse (--reuse-estimate)."""
    from producer.reuse import SCRATCH

    if given == "none":
        return ()
    if given is None:
        return (Path.cwd(), out)
    if not (Path(given) / SCRATCH).is_dir():
        raise ConfigError(f"--reuse-estimate {given}: no `fleetgen estimate` sample there (no "
                          f"{Path(given) / SCRATCH}); give the estimate's --out, or none")
    return (Path(given),)


def run(args: argparse.Namespace) -> int:
    from fleetgen.engine import engine_urls
    from producer.inputs import resolve_input

    # Once, for the whole command: InputError (one line) for a missing file or an empty glob.
    inputs = resolve_input(args.input)
    plan = engine_plan(args)
    if plan is None and not args.engine_url:
        raise ConfigError("give the servers (--engine-url URL) or how to start them "
                          "(--engine-cmd 'CMD with {port}')")
    urls = engine_urls(args.engine_url) if plan is None else []
    if plan is not None and args.measure_acceptance:
        raise ConfigError("--measure-acceptance checks running servers before the run: "
                          "start them and give --engine-url")
    listen = listen_address(args.listen)
    reuse_from(args.reuse_estimate, args.out)  # a wrong DIR is one line before anything starts
    if args.workers_per_engine < 1:
        raise ConfigError(f"--workers-per-engine must be at least 1, got "
                          f"{args.workers_per_engine}")
    external = redis_url(args.redis) if args.redis or envvars.REDIS_URL.given() else None
    if listen and external:
        raise ConfigError("--listen is for the embedded Valkey; with --redis (or "
                          "$FLEETGEN_REDIS_URL) the workers join that Redis")
    if args.retry_failures and args.turns == "all":
        raise ConfigError("--retry-failures sends failed rows of a --turns last run again; a "
                          "--turns all run's failed turns go on with `fleetgen retry` while "
                          "the run is not complete")
    if args.measure_acceptance and args.holdout:
        # Measured on holdout.jsonl with --holdout still on, the held-out rows were held out
        # again, never sent, and the run exited 0 having measured nothing.
        raise ConfigError("--measure-acceptance measures the drafter on every row given; drop "
                          f"--holdout {args.holdout} (it would hold rows out of the measure)")
    made = usable_dir(args.out)
    try:
        return _run_in(args, inputs, (urls, plan), listen, external)
    finally:
        remove_if_empty(made)  # refused before anything was written: no empty --out left


def _run_in(args: argparse.Namespace, inputs: Inputs,
            engines: tuple[list[str], EnginePlan | None],
            listen: tuple[str, int] | None, external: str | None) -> int:
    urls, plan = engines
    name, resumed = run_name(args.out, args.run)
    # Started engines' ports are leased now: their URLs are known before they are up.
    engine_set = plan.engine_set(args.out / STATE_DIR / "engines") if plan else None
    if engine_set is not None:
        urls = engine_set.urls
    values = {**vars(args), "run": name, "engine_url": urls, "context_length": None,
              "batch_size": args.batch_size or setting_default("batch_size")}
    # No Redis URL: the job connects once its Valkey is up, and hands the client down.
    settings = settings_from(argparse.Namespace(**values), None)
    if engine_set is None:  # a started engine is checked once it is ready, before its worker
        preflight(urls, settings)
    after_report: list[Step] = [_Acceptance(urls)] if args.measure_acceptance else []
    spec = FleetSpec(processes_per_gpu=args.workers_per_engine, redis_url=external,
                     redis_password=secrets.token_urlsafe(18),
                     worker_env=_protocol_env(args.engine_protocol),
                     workers_die_with_parent=plan is not None)
    with tempfile.TemporaryDirectory(prefix="fleetgen-run-") as tmp:
        fleet = LocalFleet(Path(tmp), spec, valkey_dir=args.out / STATE_DIR, servers=urls,
                           valkey_bind=listen[0] if listen else None,
                           valkey_port=listen[1] if listen else None)
        if engine_set is not None:
            fleet.with_engines(engine_set)
        return job.execute(job.NodeJob(
            "run", fleet, settings, inputs, args.out, args.out / STATE_DIR, resumed=resumed,
            after_redis=[_JoinLine(listen, name, args.engine_cmd)] if listen else [],
            after_report=after_report, check_engines=engine_set is not None,
            retry_failures=args.retry_failures, retry_command=retry_command(args.argv),
            group_by=args.group_by, resume_hint=vars(args).get("resume_hint"),
            reuse_from=reuse_from(args.reuse_estimate, args.out)))


def retry_command(argv: list[str]) -> str:
    """The command the user ran, with --retry-failures: what sends its failed rows again."""
    again = argv if "--retry-failures" in argv else [*argv, "--retry-failures"]
    return shlex.join(["fleetgen", *again])


class _Acceptance:
    """--measure-acceptance: the servers' drafters read before anything starts (refused when
    none speculates), and the acceptance lines printed once the report is written."""

    def __init__(self, urls: list[str]) -> None:
        from fleetgen.cli.acceptance import Measure

        self.measure = Measure.check(urls)

    def start(self, run: RunHandle) -> None:
        if run.built is not None:
            self.measure.print_report(run.built)

    def stop(self, run: RunHandle) -> None:
        pass


def _protocol_env(protocol: str | None) -> dict[str, str]:
    return {envvars.ENGINE_PROTOCOL.name: protocol} if protocol else {}


class _JoinLine:
    """--listen: the line another host runs to join, once the Valkey is up (its password in
    it: printed once, on the terminal that asked for --listen, as Flower's generated one):
    `fleetgen node` with its engines, or a bare worker per server already running there."""

    def __init__(self, listen: tuple[str, int], run: str, engine_cmd: str | None) -> None:
        self.listen, self.run, self.engine_cmd = listen, run, engine_cmd

    def start(self, run: RunHandle) -> None:
        host, port = self.listen
        reach = socket.gethostname() if host in ("0.0.0.0", "*") else host
        url = f"redis://:{run.job.fleet.spec.redis_password}@{reach}:{port}/0"
        cmd = shlex.quote(self.engine_cmd or "CMD with {port}")
        print(f"fleetgen run: other hosts join with (their engines and a worker each):\n"
              f"  {envvars.REDIS_URL.name}={url} fleetgen node --run {self.run} "
              f"--engine-cmd {cmd}\n"
              f"or, for servers already running there, one worker each:\n"
              f"  {envvars.REDIS_URL.name}={url} {envvars.ENGINE_URL.name}=http://SERVER:PORT "
              f"celery -A workers worker -Q fleetgen -n gpuN@%h -P threads", flush=True)

    def stop(self, run: RunHandle) -> None:
        pass
