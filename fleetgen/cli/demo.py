"""`fleetgen demo`: the whole pipeline on one machine, on an embedded Valkey and simulated GPUs."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from fleetgen.base import exitcodes
from fleetgen.base.errors import ConfigError
from fleetgen.base.outdir import FILES, RUN_MARKER, SUMMARY, OutDir
from fleetgen.base.redisconn import connect
from fleetgen.cli.produce import add_producer_options, request_options_from, sampling_from
from fleetgen.cli.progress import Bar
from fleetgen.cli.signals import sigterm_flag
from fleetgen.local.fleet import FleetSpec, LocalFleet

if TYPE_CHECKING:
    from producer.settings import ProducerSettings

OUTPUT_FILES = (*FILES.values(), SUMMARY, "report.html")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline here, on simulated GPUs",
                       description="Starts an embedded Valkey, N simulated SGLang servers and "
                       "N Celery workers, produces the prompts, drains the results to --out, "
                       "prints the summary and stops everything it started.")
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
    add_producer_options(p, demo=True)
    p.set_defaults(handler=run)


def sample_prompts() -> Path:
    return Path(str(resources.files("fleetgen") / "data" / "sample_prompts.jsonl"))


def _prepare_out(out: Path) -> None:
    """The demo overwrites only an earlier demo's output, never another run's."""
    summary = OutDir(out).summary_path
    if summary.exists():
        run = orjson.loads(summary.read_bytes()).get("run", "")
        if not str(run).startswith("demo-"):
            raise ConfigError(f"{out} holds the output of run {run!r}; pick another --out")
    elif any((out / name).exists() for name in OUTPUT_FILES):
        raise ConfigError(f"{out} already holds output files; pick another --out")
    for name in (*OUTPUT_FILES, RUN_MARKER):
        (out / name).unlink(missing_ok=True)


def run(args: argparse.Namespace) -> int:
    from producer.inputs import resolve_input

    prompts = args.prompts or sample_prompts()
    resolve_input(prompts)  # InputError (one line) for a missing file or an empty glob
    if args.gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {args.gpus}")
    _prepare_out(args.out)
    spec = FleetSpec(gpus=args.gpus, context_length=args.context_length,
                     max_running_requests=args.slots, tpot_ms=args.tpot_ms,
                     output_tokens_mean=args.output_tokens_mean,
                     task_events=bool(args.flower))
    # SIGTERM: the drainer stops within half a second and everything the demo started is
    # stopped with a short grace (its data is thrown away). The long escalation grace keeps
    # that cleanup from being interrupted; a second SIGTERM still forces the exit.
    should_stop = sigterm_flag(grace_s=10.0)
    summary: dict[str, Any] = {"complete": False}
    with tempfile.TemporaryDirectory(prefix="fleetgen-demo-") as tmp:
        fleet = LocalFleet(Path(tmp), spec)
        try:
            print(f"fleetgen demo: starting Valkey, {args.gpus} simulated GPUs and "
                  f"{args.gpus} workers ...", flush=True)
            fleet.start()
            if args.flower and not should_stop():
                _start_flower(fleet, args.flower)
            if not should_stop():
                summary = _run_pipeline(fleet, args, prompts, should_stop)
                print(summary_table(summary, args.out))
                if not should_stop():
                    _write_report(args.out)
            if args.flower and sys.stdin.isatty():
                _linger(args.flower, should_stop)
        finally:
            _stop_fleet(fleet, quickly=should_stop())
    if should_stop():
        raise KeyboardInterrupt  # main: "interrupted; run the same command again", exit 130
    return exitcodes.OK if summary["complete"] else exitcodes.INCOMPLETE


def _write_report(out: Path) -> None:
    """The run as pictures, from the output files alone, like `fleetgen report`."""
    from fleetgen.monitor.report import build

    built = build(out)
    print(f"fleetgen demo: report at {built.out} ({built.size / 1024:.0f} KiB; open it in a "
          f"browser, it needs no network; again with `fleetgen report {out}`)", flush=True)


def _stop_fleet(fleet: LocalFleet, quickly: bool) -> None:
    """Stop what the demo started; after SIGTERM without waiting for the workers' soft
    shutdown (what they hold belongs to a run that is being thrown away)."""
    fleet.procs.stop_all(grace_s=0.5 if quickly else 15.0)
    fleet.valkey.stop()


def _start_flower(fleet: LocalFleet, port: int) -> None:
    from fleetgen.local.flower import ENV_BASIC_AUTH, basic_auth, start_flower
    from fleetgen.local.ports import PortInUse

    credentials, generated = basic_auth()
    try:
        start_flower(fleet.procs, fleet.redis_url, port, credentials)
    except PortInUse as error:  # the user's own port: theirs to change, not ours to retry
        raise ConfigError(f"{error}; pick another --flower PORT") from None
    user = credentials.split(",")[0].split(":", 1)[0]
    # A generated password is shown once, on the terminal, so the user can log in; one from
    # the environment is the user's own and is not echoed.
    login = f"user {user}, password {credentials.split(':', 1)[1]}" if generated else \
        f"user {user}, password from ${ENV_BASIC_AUTH}"
    print(f"fleetgen demo: Flower at http://127.0.0.1:{port}/workers ({login})", flush=True)


def _linger(port: int, should_stop: Callable[[], bool]) -> None:
    """Keep the fleet (and Flower) up so the finished run can be inspected."""
    print(f"fleetgen demo: Flower stays up at http://127.0.0.1:{port}; Ctrl-C to stop",
          flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while not should_stop():
            time.sleep(0.1)  # the poll period of the SIGTERM flag


def _run_pipeline(fleet: LocalFleet, args: argparse.Namespace, prompts: Path,
                  should_stop: Callable[[], bool]) -> dict[str, Any]:
    from fleetgen.drainer import Drainer
    from producer.settings import ProducerSettings

    run_name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    options = {**request_options_from(args), "out": args.out}
    settings = ProducerSettings(
        **options, input=prompts, run=run_name,
        redis_url=fleet.redis_url, tokenizer=args.tokenizer,
        context_length=args.context_length, max_output_tokens=args.max_output_tokens,
        min_output_tokens=args.min_output_tokens, margin=args.margin,
        sampling=sampling_from(args), high_water=args.high_water, batch_size=args.batch_size)
    errors: list[BaseException] = []
    thread = threading.Thread(target=_produce_in_thread, args=(settings, errors), daemon=True)
    thread.start()
    print(f"fleetgen demo: run {run_name}; watch it from another shell with\n"
          f"  FLEETGEN_REDIS_URL={fleet.redis_url} fleetgen status --run {run_name} --watch",
          flush=True)
    drainer = Drainer(connect(fleet.redis_url), run_name, args.out)
    drainer.recover()
    bar = Bar("rows written")

    def on_progress(d: Drainer) -> None:
        if errors:
            raise errors[0]
        manifest = d.manifest()
        total = manifest.get("total") or manifest.get("expected")
        bar.advance_to(d.tally.written, int(total) if total else None)

    try:
        drainer.run_until_complete(on_progress=on_progress, should_stop=should_stop)
    finally:
        drainer.close()
        bar.close()
    if not should_stop():  # stopped: the producer thread (a daemon) dies with the process
        thread.join(timeout=5)
    return drainer.write_summary()


def _produce_in_thread(settings: ProducerSettings, errors: list[BaseException]) -> None:
    from producer.runner import produce

    try:
        # --turns all: the producer stays to build each next turn from the answers written.
        produce(settings, wait=settings.turns == "all")
    except BaseException as exc:  # handed to the main thread, which reports it
        errors.append(exc)


def summary_table(s: dict[str, Any], out: Path) -> str:
    rows = [("run", s["run"]), ("rows", s["total"]), ("done", s["done"]),
            ("failed", s["failed"]), ("rejected", s["rejected"]),
            ("truncated (finish=length)", s["truncated"]),
            ("prompt tokens", s["prompt_tokens"]), ("completion tokens", s["completion_tokens"]),
            ("wall time", f"{s['wall_s']} s"), ("rows/s", s["rows_per_s"]),
            ("completion tokens/s", s["completion_tokens_per_s"]),
            ("complete", "yes" if s["complete"] else "NO"), ("output", str(out))]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
