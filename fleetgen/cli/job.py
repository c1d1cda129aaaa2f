"""The whole job on one node, the one code path of `fleetgen run` (real servers) and `fleetgen
demo` (simulated ones): Redis, a worker per engine, the producer beside the drainer until every
row is accounted for, the summary and the report; stopped by Ctrl-C or SIGTERM within 2 s and
resumed by the same command."""

from __future__ import annotations

import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from fleetgen.base import diskfull, exitcodes
from fleetgen.base.contract import KIND_FAILURE, closing_key
from fleetgen.base.outdir import DrainDir
from fleetgen.base.redisconn import connect
from fleetgen.cli.progress import Bar
from fleetgen.cli.runview import FleetView, LogLine
from fleetgen.cli.signals import Stopped, sigterm_flag
from fleetgen.local.engines import publish
from fleetgen.local.fleet import LocalFleet

if TYPE_CHECKING:
    from fleetgen.drainer import Drainer
    from fleetgen.monitor.report import Built
    from producer.settings import ProducerSettings

# After Ctrl-C or SIGTERM the command must be gone within 2 s: past this grace the handler
# interrupts whatever still blocks (starting the fleet, a Redis call riding out an outage);
# the summary and the cleanup that follow are shielded from it (`shield_from_signals`).
STOP_GRACE_S = 1.5
# How long the workers may take to come online: a real server's worker without -c waits for
# its engine (the pre-flight saw it ready) and reads its pool size from it.
WORKERS_READY_S = {"demo": 60.0, "run": 180.0}
# How often the engines this node started are written for `fleetgen status`.
ENGINES_EVERY_S = 2.0


@dataclass
class NodeJob:
    command: str  # "run" or "demo": the name its messages carry
    fleet: LocalFleet  # not started yet
    settings: ProducerSettings  # the Redis URL is the fleet's, filled in once it is up
    out: Path
    state_dir: Path  # the embedded Valkey's data, kept until the run is complete
    resumed: bool
    # Called once Redis is up, before the workers: Flower, the line for other hosts' workers.
    on_redis: Callable[[LocalFleet], None] | None = None
    linger: Callable[[Callable[[], bool]], None] | None = None
    # `fleetgen run --retry-failures`: the rows in failures.jsonl are sent again; and the
    # command that does it, for the last line of a run that ends with failures.
    retry_failures: bool = False
    retry_command: str | None = None
    # The report's extra breakdown of speculative acceptance (a row field), and what to do
    # with the report once written (`--measure-acceptance` prints its acceptance).
    group_by: str | None = None
    on_report: Callable[[Built], None] | None = None
    # What resumes it, where that is not this command with this --out (the estimate's sample
    # run: its --out is the estimate's scratch directory, which the user never typed).
    resume_hint: str | None = None

    def say(self, text: str) -> None:
        print(f"fleetgen {self.command}: {text}", flush=True)


def execute(job: NodeJob) -> int:
    """Run the job to its end (or its stop); exit code as `main` expects it."""
    # Ctrl-C and SIGTERM alike: the drainer stops within half a second, the summary is
    # written, and everything started is stopped with a short grace (what the workers held
    # goes back to the queue at the next start: `requeue_unacked`).
    should_stop = sigterm_flag(grace_s=STOP_GRACE_S, signums=(signal.SIGTERM, signal.SIGINT))
    summary: dict[str, Any] = {"complete": False}
    fleet = job.fleet
    try:
        engines = "simulated GPUs" if job.command == "demo" else "engines"
        job.say(f"{'resuming' if job.resumed else 'starting'} run {job.settings.run}: Valkey, "
                f"{fleet.spec.gpus} {engines} and {len(fleet.worker_names())} workers ...")
        fleet.start(timeout_s=WORKERS_READY_S[job.command],
                    before_workers=lambda url: _before_workers(job, url))
        if not should_stop():
            settings = replace(job.settings, redis_url=fleet.redis_url)
            if fleet.engines is not None:  # the limits of the engines that started
                settings = replace(settings, engine_url=tuple(fleet.serving_urls()))
            summary = run_pipeline(job, settings, should_stop)
            print(summary_table(summary, job.out))
            _say_how_it_ended(job, summary, should_stop())
        if job.linger is not None and not should_stop():
            job.linger(should_stop)
        if summary["complete"] and fleet.spec.redis_url is None and not should_stop():
            _close_redis(job, should_stop)
    except redis.ResponseError as exc:
        # MISCONF: the run's Redis cannot write its data (a full disk, most often): one line
        # naming where, as for the output files (fleetgen/base/diskfull.py).
        full = diskfull.from_redis_error(exc, None if fleet.spec.redis_url else job.state_dir)
        if full is None:
            raise
        raise full from None
    finally:
        shield_from_signals()
        fleet.stop_processes(grace_s=0.5 if should_stop() else 15.0)
        fleet.valkey.stop()
    if summary["complete"]:
        shutil.rmtree(job.state_dir, ignore_errors=True)  # nothing left to resume
    if should_stop():
        # Said how to resume already (`_say_how_it_ended`): main exits 130 without a line of
        # its own; stopped before that (the fleet starting), main says it.
        raise Stopped if "run" in summary else KeyboardInterrupt
    # Failed rows are rows the user asked for and does not have: not a success (the last
    # line said how many, and how to send them again).
    return exitcodes.OK if summary["complete"] and not summary.get("failed") \
        else exitcodes.INCOMPLETE


def shield_from_signals() -> None:
    """From here on the command only writes what it has and stops what it started, each step
    bounded (a worker gets half a second, then SIGKILL): neither another signal nor the
    handler's grace timer may interrupt that half-way and leave processes behind."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)


def url_file(job: NodeJob) -> Path:
    """Where the run's Redis URL (its password in it) is kept for `status` and the others,
    readable by the user alone: a secret is written to no terminal or log."""
    return job.state_dir / "redis.url"


def _before_workers(job: NodeJob, redis_url: str) -> None:
    """Once Redis is up, before any server or worker: a resume whose settings differ from the
    run's is one line now (not after the fleet has started); the URL for the user's other
    commands; the prompts a stopped run's workers held, back in the queue."""
    from fleetgen.base.wire import requeue_unacked
    from producer.runner import check_resume

    check_resume(replace(job.settings, redis_url=redis_url))

    path = url_file(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(redis_url + "\n")

    # A Valkey that an earlier, finished run announced closed (kept by a failed cleanup)
    # must not send this run's workers away at their first beat.
    connect(redis_url).delete(closing_key())
    requeued = requeue_unacked(connect(redis_url))
    if requeued:
        job.say(f"{requeued} prompt(s) the stopped workers held are queued again")
    if job.on_redis is not None:
        job.on_redis(job.fleet)


def _say_how_it_ended(job: NodeJob, summary: dict[str, Any], interrupted: bool) -> None:
    if interrupted:
        job.say("interrupted; what is written is kept: " + (
            job.resume_hint or f"run the same command (same --out {job.out}) to resume run "
            f"{summary['run']}"))
        return
    _write_report(job)  # the report shows what a --stop-if rule saw, too
    if summary.get("stopped"):
        job.say(f"stopped early: {summary['stopped']}; the requests sent before the stop are "
                f"all written. Fix the settings and run it with another --out, or the same "
                f"command plus --ignore-stop to go on")
    if summary["complete"] and summary.get("failed"):
        again = (f"send them again with: {job.retry_command}" if job.retry_command else
                 "each is kept there with its error")
        job.say(f"complete with {summary['failed']} failed row(s) (in "
                f"{DrainDir(job.out).file(KIND_FAILURE)}); {again}")


def _close_redis(job: NodeJob, should_stop: Callable[[], bool]) -> None:
    """The run's own Valkey stops next: the workers that joined from other hosts exit, the
    live pages read the end, before it does (fleetgen/base/closing.py)."""
    from fleetgen.base import closing

    client = connect(job.fleet.redis_url)
    own = [f"{name}@{socket.gethostname()}" for name in job.fleet.worker_names()]
    at = closing.announce(client, job.settings.run)
    left = closing.wait_for_leavers(client, own, at, should_stop=should_stop)
    if left.workers:
        job.say(f"worker(s) {', '.join(left.workers)} did not leave; stop them by hand "
                "(the run is complete, they only retry its Redis)")


def _write_report(job: NodeJob) -> None:
    """The run as pictures, from the output files alone, like `fleetgen report`."""
    from fleetgen.monitor.report import build

    built = build(job.out, group_by=job.group_by)
    job.say(f"report at {built.out} ({built.size / 1024:.0f} KiB; open it in a browser, it "
            f"needs no network; again with `fleetgen report {job.out}`)")
    if job.on_report is not None:
        job.on_report(built)


def run_pipeline(job: NodeJob, settings: ProducerSettings,
                 should_stop: Callable[[], bool]) -> dict[str, Any]:
    from fleetgen.drainer import Drainer

    assert settings.out is not None
    # The drainer first: on a resumed run it tells Redis what the files hold (done bits),
    # so the producer sends only what is not written yet.
    drainer = Drainer(connect(job.fleet.redis_url), settings.run, settings.out)
    drainer.recover()
    if job.retry_failures:
        _send_failures_again(job, drainer)
    opened = threading.Event()
    producer = Beside(producing(settings, opened))
    # The drainer ends a run that is stopped and settled: a resumed one with --ignore-stop
    # still is until the producer has opened it again (its first batch).
    while not (opened.wait(0.05) or not producer.thread.is_alive() or should_stop()):
        pass
    job.say(f"run {settings.run}; watch it from another shell with\n"
            f"  FLEETGEN_REDIS_URL=$(cat {url_file(job)}) fleetgen status --run "
            f"{settings.run} --watch")
    bar = Bar("requests written", show=sys.stderr.isatty())
    # An engine's fall and return are said where the run was started (above the bar).
    view = FleetView(connect(job.fleet.redis_url), settings.run,
                     [job.fleet.engine_url(gpu) for gpu in range(job.fleet.spec.gpus)],
                     lambda text: bar.note(f"fleetgen {job.command}: {text}"))
    ticker = LogLine(job.say)
    engines_due = [0.0]  # when this node's engines are next written for `status`

    def on_progress(d: Drainer) -> None:
        producer.raise_error()
        if job.fleet.engines is not None and time.monotonic() >= engines_due[0]:
            engines_due[0] = time.monotonic() + ENGINES_EVERY_S
            publish(d.redis, settings.run, job.fleet.engines.views())
        total = d.manifest().rows
        view.look()
        up, engines = view.engines_up
        bar.advance_to(d.tally.written, total)
        note = job.fleet.engines.note() if job.fleet.engines is not None else ""
        bar.postfix(f"engines {up}/{engines}" + (f", {note}" if note else ""))
        ticker.tick(d.tally.written, total, in_flight=view.in_flight,
                    engines=view.engines_up, note=note)

    try:
        drain_beside(drainer, producer, on_progress=on_progress, should_stop=should_stop)
    finally:
        if should_stop():
            shield_from_signals()  # the summary below is what the signal asked for
        drainer.close()
        bar.close()
    return drainer.write_summary()


def _send_failures_again(job: NodeJob, drainer: Drainer) -> None:
    """The rows the files hold as failures go back to work: their done bits cleared and
    listed as in retry (so the run is not complete until each lands again), before the
    producer's pass, which sends every row not done. The drainer stays the one writer: a
    success replaces the failure line (fleetgen/drainer/store.py)."""
    from fleetgen.base.runstate import mark_retrying

    lines = drainer.tally.lines_of(KIND_FAILURE)
    if lines:
        mark_retrying(drainer.redis, drainer.run, lines)
    job.say(f"sending {len(lines)} failed row(s) of run {drainer.run} again"
            if lines else f"run {drainer.run} has no failed rows to send again")


class Beside:
    """`work` (the producer) in a thread beside the drainer; an error it raises is handed to
    the drainer's loop (`raise_error`), which stops the command with it."""

    def __init__(self, work: Callable[[], object]) -> None:
        self.errors: list[BaseException] = []
        self._work = work
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # handed to the drainer's thread, which raises it
            self.errors.append(exc)

    def raise_error(self) -> None:
        if self.errors:
            raise self.errors[0]


def producing(settings: ProducerSettings, opened: threading.Event) -> Callable[[], object]:
    """The producer as the job runs it: quiet (the drainer's bar is the progress), `opened`
    set at its first batch; it stays until every row has an outcome, as `fleetgen produce`
    does: it builds each next turn of --turns all, re-enqueues what Redis lost, and sweeps
    the workers' own queues (prefix affinity sends first turns there only while it stays)."""
    from producer.runner import Quiet, produce

    class Opened(Quiet):
        def read(self, rows: int, total: int) -> None:
            opened.set()

    return lambda: produce(settings, wait=True, hooks=Opened())


def drain_beside(drainer: Drainer, producer: Beside, *,
                 on_progress: Callable[[Drainer], None] | None = None,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
    """The drainer here until the run is complete (or `should_stop`), the producer's error
    raised at the next batch; then the producer's thread is given a moment to end."""

    def check(d: Drainer) -> None:
        producer.raise_error()
        if on_progress is not None:
            on_progress(d)

    drainer.run_until_complete(on_progress=check, should_stop=should_stop)
    if not should_stop():  # stopped: the producer thread (a daemon) dies with the process
        producer.thread.join(timeout=5)
    producer.raise_error()


def held_out(s: dict[str, Any]) -> str:
    """Held-out requests and the rows they are (holdout.jsonl's lines): a row of --n 4 or of
    four turns is four requests, and `requests` above counts requests."""
    rows = s.get("holdout_rows")
    return f"{s['holdout']} requests" + ("" if rows is None else f" ({rows} rows)")


def summary_table(s: dict[str, Any], out: Path) -> str:
    rows = [("run", s["run"]), ("requests", s["total"])]
    if s.get("input_rows") is not None:
        rows.append(("input lines", s["input_rows"]))
    rows += [("done", s["done"]),
            ("failed", s["failed"]), ("rejected", s["rejected"]),
            *([("held out (holdout.jsonl)", held_out(s))] if s.get("holdout") else []),
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
