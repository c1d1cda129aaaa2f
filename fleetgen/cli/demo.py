"""`fleetgen demo`: the whole pipeline on one machine, on an embedded Valkey and simulated GPUs.

Starts an embedded Valkey, N simulated SGLang servers and N Celery workers, produces the
prompts, drains the results to --out, prints the summary and stops everything it started.
Interrupted (Ctrl-C, SIGTERM), the same command with the same --out resumes the run; once a run
is complete, it starts a new one there.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import shutil
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetgen.cli import job
from fleetgen.cli.flags import subcommand
from fleetgen.cli.produce import add_producer_options, settings_from
from fleetgen.errors import ConfigError
from fleetgen.local.enginecmd import EnginePolicy, parse_engine_cmd
from fleetgen.local.engines import EngineSet
from fleetgen.local.fleet import FleetSpec, LocalFleet
from fleetgen.records.outdir import FILES, RUN_MARKER, SUMMARY, OutputDir, usable_dir
from fleetgen.settings import runoptions
from producer.settings import setting_default

if TYPE_CHECKING:
    from fleetgen.cli.nodejob import RunHandle
    from producer.settings import ProducerSettings

# Beside the output files: the demo's Valkey (its AOF), kept until the run is complete, so the
# same command with the same --out resumes the run recorded there instead of starting again.
STATE_DIR = ".fleetgen-demo"
# With --stop-if, rows go out this many at a time and the queue holds no more, so the rule
# is judged while most of a small set is still unsent (the default 512 would send the
# bundled set whole before the first answer is back).
STOP_IF_BATCH = 16
# A simulator loads in a second or two: a minute is plenty, and one that stops answering for
# 10 s is restarted.
SIM_POLICY = EnginePolicy(start_timeout_s=60.0, unhealthy_after_s=10.0)


def output_files() -> tuple[str, ...]:
    from fleetgen.monitor.report import REPORT_NAME

    return (*FILES.values(), SUMMARY, REPORT_NAME)


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "demo", "run the whole pipeline here, on simulated GPUs", __doc__, run)
    p.add_argument("--prompts", type=Path, metavar="FILE",
                   help="prompts, as `fleetgen produce` reads them: a file, a directory or a "
                   "glob (default: the bundled sample)")
    p.add_argument("--out", type=Path, default=Path("out/demo"), metavar="DIR",
                   help="output dir (out/demo)")
    p.add_argument("--gpus", type=int, default=8, metavar="N", help="simulated GPUs (8)")
    p.add_argument("--context-length", type=int, default=8192, metavar="N",
                   help="server context (8192)")
    p.add_argument("--slots", type=int, default=32, metavar="K",
                   help="running requests per server (32)")
    p.add_argument("--tpot-ms", type=float, default=1.0, metavar="MS",
                   help="simulated ms per token (1)")
    p.add_argument("--output-tokens-mean", type=int, default=200, metavar="N",
                   help="simulated mean completion length (200)")
    p.add_argument("--flower", type=int, metavar="PORT",
                   help="also serve Flower (Celery's web UI) on 127.0.0.1:PORT, with basic "
                   "auth from $FLOWER_BASIC_AUTH (user:password) or a generated password "
                   "that is printed; it stays up after the run until Ctrl-C when run in a "
                   "terminal")
    add_producer_options(p, runoptions.DEMO)


def sample_prompts() -> Path:
    return Path(str(resources.files("fleetgen") / "data" / "sample_prompts.jsonl"))


def _recorded_run(out: OutputDir) -> str | None:
    """The run whose output `out` holds (the drainer's marker, else the summary's), if any."""
    return out.owner() or str((out.read_summary() or {}).get("run", "")) or None


def _prepare_out(out: Path) -> str | None:
    """The run to resume in `out` (an unfinished demo whose Redis state is kept there), or
    None after clearing an earlier, finished demo's output for a new run. The demo touches
    only its own output, never another run's."""
    outdir = OutputDir(out)
    run = _recorded_run(outdir)
    if run is None and any((out / name).exists() for name in output_files()):
        raise ConfigError(f"{out} already holds output files; pick another --out")
    if run is not None and not run.startswith("demo-"):
        raise ConfigError(f"{out} holds the output of run {run!r}; pick another --out")
    complete = bool((outdir.read_summary() or {}).get("complete"))
    # Exports (export.FORMAT.jsonl, export.parquet) are of results that are about to change.
    for stale in out.glob("export.*"):
        stale.unlink()
    if run is not None and not complete and (out / STATE_DIR).is_dir():
        return run
    for name in (*output_files(), RUN_MARKER):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / STATE_DIR, ignore_errors=True)
    return None


def _settings(args: argparse.Namespace, prompts: Path, run_name: str) -> ProducerSettings:
    """The producer's settings through `fleetgen produce`'s own path, checked before the
    fleet starts (a bad --n or --logprobs is one line at once); the Redis URL comes later."""
    values = {**vars(args), "input": prompts, "run": run_name}
    if args.stop_if:
        values["high_water"] = args.high_water or STOP_IF_BATCH
    values["batch_size"] = args.batch_size or (STOP_IF_BATCH if args.stop_if
                                                   else setting_default("batch_size"))
    return settings_from(argparse.Namespace(**values), None)  # the job connects, once


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: every command's parser imports this module, and the simulator
    # stays off `fleetgen run`'s path (tests/e2e/test_run_imports.py).
    from fleetgen.local.simgpus import SimGpus
    from producer.inputs import resolve_input

    prompts = args.prompts or sample_prompts()
    # Once, for the whole command: InputError (one line) for a missing file or an empty glob.
    inputs = resolve_input(prompts)
    if args.gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {args.gpus}")
    usable_dir(args.out)
    resumed = _prepare_out(args.out)
    run_name = resumed or f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    settings = _settings(args, prompts, run_name)
    gpus = SimGpus(gpus=args.gpus, context_length=args.context_length,
                   max_running_requests=args.slots, tpot_ms=args.tpot_ms,
                   output_tokens_mean=args.output_tokens_mean)
    spec = FleetSpec(task_events=bool(args.flower), redis_password=secrets.token_urlsafe(18),
                     concurrency=args.slots, worker_env=gpus.worker_env)
    # `fleetgen run --engine-cmd` on simulated servers: the same job, one simulator a GPU
    # started, watched, restarted and stopped as real servers are.
    engines = EngineSet(parse_engine_cmd(gpus.engine_cmd()),
                        [(str(gpu),) for gpu in range(args.gpus)], SIM_POLICY,
                        args.out / STATE_DIR / "engines")
    with tempfile.TemporaryDirectory(prefix="fleetgen-demo-") as tmp:
        fleet = LocalFleet(Path(tmp), spec, valkey_dir=args.out / STATE_DIR).with_engines(
            engines)
        flower = args.flower
        return job.execute(job.NodeJob(
            "demo", fleet, settings, inputs, args.out, args.out / STATE_DIR,
            resumed=bool(resumed), after_redis=[_Flower(flower)] if flower else [],
            after_report=[_Linger(flower)] if flower and sys.stdin.isatty() else []))


class _Flower:
    """--flower: Flower on the run's Redis, in the fleet's process group (stopped with the
    workers)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def start(self, run: RunHandle) -> None:
        from fleetgen.local.flower import ENV_BASIC_AUTH, basic_auth, start_flower
        from fleetgen.local.ports import PortInUse

        fleet, port = run.job.fleet, self.port
        credentials, generated = basic_auth()
        try:
            start_flower(fleet.procs, fleet.redis_url, port, credentials)
        except PortInUse as error:  # the user's own port: theirs to change, not ours to retry
            raise ConfigError(f"{error}; pick another --flower PORT") from None
        user = credentials.split(",")[0].split(":", 1)[0]
        # A generated password is shown once, on the terminal, so the user can log in; one
        # from the environment is the user's own and is not echoed.
        login = f"user {user}, password {credentials.split(':', 1)[1]}" if generated else \
            f"user {user}, password from ${ENV_BASIC_AUTH}"
        print(f"fleetgen demo: Flower at http://127.0.0.1:{port}/workers ({login})",
              flush=True)

    def stop(self, run: RunHandle) -> None:
        pass


class _Linger:
    """Keeps the fleet (and Flower) up once the run is done, so it can be inspected."""

    def __init__(self, port: int) -> None:
        self.port = port

    def start(self, run: RunHandle) -> None:
        print(f"fleetgen demo: Flower stays up at http://127.0.0.1:{self.port}; Ctrl-C to "
              "stop", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while not run.should_stop():
                time.sleep(0.1)  # the poll period of the SIGTERM flag

    def stop(self, run: RunHandle) -> None:
        pass
