"""`fleetgen demo`: the whole pipeline on one machine, on an embedded Valkey and simulated GPUs."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetgen.base import exitcodes
from fleetgen.base.errors import ConfigError
from fleetgen.base.outdir import FILES, RUN_MARKER, SUMMARY, OutDir, usable_dir
from fleetgen.base.redisconn import connect
from fleetgen.cli.produce import add_producer_options, settings_from
from fleetgen.cli.progress import Bar
from fleetgen.cli.signals import sigterm_flag
from fleetgen.local.fleet import FleetSpec, LocalFleet
from producer.settings import setting_default

if TYPE_CHECKING:
    from producer.settings import ProducerSettings

# Beside the output files: the demo's Valkey (its AOF), kept until the run is complete, so the
# same command with the same --out resumes the run recorded there instead of starting again.
STATE_DIR = ".fleetgen-demo"
# With --stop-if, rows go out this many at a time and the queue holds no more, so the rule
# is judged while most of a small set is still unsent (the default 512 would send the
# bundled set whole before the first answer is back).
STOP_IF_BATCH = 16
# After Ctrl-C or SIGTERM the demo must be gone within 2 s: past this grace the handler
# interrupts whatever still blocks (starting the fleet, a Redis call riding out an outage);
# the summary and the cleanup that follow are shielded from it (`_shield_from_signals`).
STOP_GRACE_S = 1.5


def output_files() -> tuple[str, ...]:
    from fleetgen.monitor.report import REPORT_NAME

    return (*FILES.values(), SUMMARY, REPORT_NAME)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline here, on simulated GPUs",
                       description="Starts an embedded Valkey, N simulated SGLang servers and "
                       "N Celery workers, produces the prompts, drains the results to --out, "
                       "prints the summary and stops everything it started. Interrupted "
                       "(Ctrl-C, SIGTERM), the same command with the same --out resumes the "
                       "run; once a run is complete, it starts a new one there.")
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


def _recorded_run(out: OutDir) -> str | None:
    """The run whose output `out` holds (the drainer's marker, else the summary's), if any."""
    return out.owner() or str((out.read_summary() or {}).get("run", "")) or None


def _prepare_out(out: Path) -> str | None:
    """The run to resume in `out` (an unfinished demo whose Redis state is kept there), or
    None after clearing an earlier, finished demo's output for a new run. The demo touches
    only its own output, never another run's."""
    outdir = OutDir(out)
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
    return settings_from(argparse.Namespace(**values), "redis://127.0.0.1:6379/0")


def run(args: argparse.Namespace) -> int:
    from producer.inputs import resolve_input

    prompts = args.prompts or sample_prompts()
    resolve_input(prompts)  # InputError (one line) for a missing file or an empty glob
    if args.gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {args.gpus}")
    usable_dir(args.out)
    resumed = _prepare_out(args.out)
    run_name = resumed or f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    settings = _settings(args, prompts, run_name)
    spec = FleetSpec(gpus=args.gpus, context_length=args.context_length,
                     max_running_requests=args.slots, tpot_ms=args.tpot_ms,
                     output_tokens_mean=args.output_tokens_mean,
                     task_events=bool(args.flower))
    # Ctrl-C and SIGTERM alike: the drainer stops within half a second, the summary is
    # written, and everything the demo started is stopped with a short grace (what the
    # workers held goes back to the queue at the next start: `requeue_unacked`).
    should_stop = sigterm_flag(grace_s=STOP_GRACE_S, signums=(signal.SIGTERM, signal.SIGINT))
    summary: dict[str, Any] = {"complete": False}
    with tempfile.TemporaryDirectory(prefix="fleetgen-demo-") as tmp:
        fleet = LocalFleet(Path(tmp), spec, valkey_dir=args.out / STATE_DIR)
        try:
            print(f"fleetgen demo: {'resuming' if resumed else 'starting'} run {run_name}: "
                  f"Valkey, {args.gpus} simulated GPUs and {args.gpus} workers ...", flush=True)
            fleet.start(before_workers=_requeue_held)
            if args.flower and not should_stop():
                _start_flower(fleet, args.flower)
            if not should_stop():
                settings = replace(settings, redis_url=fleet.redis_url)
                summary = _run_pipeline(fleet, settings, should_stop)
                print(summary_table(summary, args.out))
                _say_how_it_ended(summary, args.out, should_stop())
            if args.flower and sys.stdin.isatty():
                _linger(args.flower, should_stop)
        finally:
            _shield_from_signals()
            _stop_fleet(fleet, quickly=should_stop())
    if summary["complete"]:
        shutil.rmtree(args.out / STATE_DIR, ignore_errors=True)  # nothing left to resume
    if should_stop():
        raise KeyboardInterrupt  # main: "interrupted; run the same command again", exit 130
    return exitcodes.OK if summary["complete"] else exitcodes.INCOMPLETE


def _shield_from_signals() -> None:
    """From here on the demo only writes what it has and stops what it started, each step
    bounded (a worker gets half a second, then SIGKILL): neither another signal nor the
    handler's grace timer may interrupt that half-way and leave processes behind."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)


def _requeue_held(redis_url: str) -> None:
    """A resumed demo's Redis, before any worker: the prompts its stopped workers held."""
    from fleetgen.base.wire import requeue_unacked

    requeued = requeue_unacked(connect(redis_url))
    if requeued:
        print(f"fleetgen demo: {requeued} prompt(s) the stopped workers held are queued again",
              flush=True)


def _say_how_it_ended(summary: dict[str, Any], out: Path, interrupted: bool) -> None:
    if interrupted:
        print(f"fleetgen demo: interrupted; what is written is kept: run the same command "
              f"(same --out {out}) to resume run {summary['run']}", flush=True)
    elif summary.get("stopped"):
        _write_report(out)  # the report shows what the rule saw
        print(f"fleetgen demo: stopped early: {summary['stopped']}; the requests sent before "
              f"the stop are all written. Fix the settings and run the demo with another "
              f"--out, or the same command plus --ignore-stop to go on", flush=True)
    else:
        _write_report(out)


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


def _run_pipeline(fleet: LocalFleet, settings: ProducerSettings,
                  should_stop: Callable[[], bool]) -> dict[str, Any]:
    from fleetgen.drainer import Drainer

    assert settings.out is not None
    run_name = settings.run
    # The drainer first: on a resumed run it tells Redis what the files hold (done bits),
    # so the producer sends only what is not written yet.
    drainer = Drainer(connect(fleet.redis_url), run_name, settings.out)
    drainer.recover()
    errors: list[BaseException] = []
    opened = threading.Event()
    thread = threading.Thread(target=_produce_in_thread, args=(settings, errors, opened),
                              daemon=True)
    thread.start()
    # The drainer ends a run that is stopped and settled: a resumed one with --ignore-stop
    # still is until the producer has opened it again (its first batch).
    while not (opened.wait(0.05) or not thread.is_alive() or should_stop()):
        pass
    print(f"fleetgen demo: run {run_name}; watch it from another shell with\n"
          f"  FLEETGEN_REDIS_URL={fleet.redis_url} fleetgen status --run {run_name} --watch",
          flush=True)
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
        if should_stop():
            _shield_from_signals()  # the summary below is what the signal asked for
        drainer.close()
        bar.close()
    if not should_stop():  # stopped: the producer thread (a daemon) dies with the process
        thread.join(timeout=5)
    return drainer.write_summary()


def _produce_in_thread(settings: ProducerSettings, errors: list[BaseException],
                       opened: threading.Event) -> None:
    from producer.runner import Quiet, produce

    class Opened(Quiet):
        def read(self, rows: int, total: int) -> None:
            opened.set()

    try:
        # --turns all: the producer stays to build each next turn from the answers written.
        produce(settings, wait=settings.turns == "all", hooks=Opened())
    except BaseException as exc:  # handed to the main thread, which reports it
        errors.append(exc)


def summary_table(s: dict[str, Any], out: Path) -> str:
    rows = [("run", s["run"]), ("rows", s["total"]), ("done", s["done"]),
            ("failed", s["failed"]), ("rejected", s["rejected"]),
            ("truncated (finish=length)", s["truncated"]),
            ("prompt tokens", s["prompt_tokens"]), ("completion tokens", s["completion_tokens"]),
            ("wall time", f"{s['wall_s']} s"), ("rows/s", s["rows_per_s"]),
            ("completion tokens/s", s["completion_tokens_per_s"]),
            ("complete", "yes" if s["complete"] else "NO")]
    if s.get("stopped"):
        rows.append(("stopped early", s["stopped"]))
    rows.append(("output", str(out)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
