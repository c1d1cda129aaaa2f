"""The steps of a job on one node, which fleetgen/cli/job.py lists in their order: each starts
what it owns and stops it again; the job starts them in order and stops those it started in
reverse. What a step makes for the next ones (the run's Redis client, its drainer, its
producer, its summary) is kept on the `RunHandle` they all share."""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fleetgen.cli.beside import Beside
from fleetgen.cli.progress import Bar
from fleetgen.cli.runview import FleetView, LogLine
from fleetgen.cli.signals import shield_from_signals
from fleetgen.cli.summary import summary_table
from fleetgen.local.engines import publish
from fleetgen.queue.contract import KIND_FAILURE, closing_key
from fleetgen.queue.redisconn import connect
from fleetgen.records.outdir import OutputDir

if TYPE_CHECKING:
    from fleetgen.cli.nodejob import NodeJob, RunHandle
    from fleetgen.drainer import Drainer
    from producer.settings import ProducerSettings

# How often the engines this node started are written for `fleetgen status`.
ENGINES_EVERY_S = 2.0
# How long the workers may take to come online: a real server's worker without -c waits for
# its engine (the pre-flight saw it ready) and reads its pool size from it.
WORKERS_READY_S = {"demo": 60.0, "run": 180.0}


class Valkey:
    """The run's own Valkey (its AOF under the state directory), unless a Redis was given."""

    def start(self, run: RunHandle) -> None:
        fleet = run.job.fleet
        if fleet.spec.redis_url is None:
            fleet.valkey.start()

    def stop(self, run: RunHandle) -> None:
        run.job.fleet.valkey.stop()


class RunState:
    """The run's Redis client, and before any server or worker starts: a resume whose settings
    differ from the run's is one line; the URL for the user's other commands; the prompts a
    stopped run's workers held, back in the queue."""

    def start(self, run: RunHandle) -> None:
        from fleetgen.queue.wire import requeue_unacked
        from producer.runner import check_resume

        job = run.job
        run.client = connect(job.fleet.redis_url)
        run.resume = check_resume(job.settings, job.inputs, run.client)
        path = url_file(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(job.fleet.redis_url + "\n")
        # A Valkey that an earlier, finished run announced closed (kept by a failed cleanup)
        # must not send this run's workers away at their first beat.
        run.client.delete(closing_key())
        requeued = requeue_unacked(run.client)
        if requeued:
            job.say(f"{requeued} prompt(s) the stopped workers held are queued again")

    def stop(self, run: RunHandle) -> None:
        if run.client is not None:
            run.client.close()


class Engines:
    """The servers this node starts itself (`--engine-cmd`, the demo's simulators): all at
    once, each watched and restarted by its own thread; stopped after the workers."""

    def start(self, run: RunHandle) -> None:
        engines = run.job.fleet.engines
        if engines is None:
            return
        run.job.say(f"starting {len(engines.engines)} engine(s), logs in "
                    f"{engines.engines[0].log_path.parent}")
        engines.start(run.job.say, silence=run.job.fleet.worker_silence(run.redis))

    def stop(self, run: RunHandle) -> None:
        engines = run.job.fleet.engines
        if engines is not None:
            engines.stop(run.grace_s if run.hurry else None)


class Workers:
    """A worker per engine (N with --workers-per-engine): a started engine's as soon as it is
    ready and, on `fleetgen run`, passes the pre-flight; online once each has beaten."""

    def start(self, run: RunHandle) -> None:
        job, fleet = run.job, run.job.fleet
        if fleet.engines is None:
            for gpu in range(fleet.spec.gpus):
                fleet.start_gpu_workers(gpu)
        else:
            self._as_engines_come(run)
        fleet.wait_workers_ready(WORKERS_READY_S[job.command], client=run.redis)

    @staticmethod
    def _as_engines_come(run: RunHandle) -> None:
        from fleetgen.cli.preflight import preflight

        job, fleet = run.job, run.job.fleet
        assert fleet.engines is not None
        ready = []
        for gpu in fleet.engines.ready_as_they_come():
            if job.check_engines:
                preflight([fleet.engine_urls[gpu]], job.settings)
            fleet.start_gpu_workers(gpu)
            ready.append(gpu)
        fleet.engines_settled(ready)

    def stop(self, run: RunHandle) -> None:
        """The workers (and Flower, in the same process group) before the engines: nothing
        is sent to an engine going away. Stopped by a signal, the engines begin to stop now
        too, all at once, to be gone in 2 s."""
        fleet = run.job.fleet
        if fleet.engines is not None and run.hurry:
            fleet.engines.begin_stop(run.grace_s)
        fleet.procs.stop_all(grace_s=run.grace_s)


class Drain:
    """The drainer, first of the two: on a resumed run it tells Redis what the files hold
    (done bits), so the producer sends only what is not written yet."""

    def start(self, run: RunHandle) -> None:
        from fleetgen.drainer import Drainer

        job = run.job
        run.drainer = Drainer(run.redis, job.settings.run, job.out)
        run.drainer.recover()
        if job.retry_failures:
            send_failures_again(job, run.drainer)

    def stop(self, run: RunHandle) -> None:
        if run.drainer is not None:
            run.drainer.close()


class EstimateAnswers:
    """The answers of an estimate's sample that the run writes as its own, not sending their
    rows (producer/reuse.py): found before the producer starts, each sample said reused or
    why not; at the end, how many the files hold and why the others were not."""

    def start(self, run: RunHandle) -> None:
        from producer.reuse import candidates, samples_in

        job = run.job
        assert run.resume is not None
        samples = samples_in(job.reuse_from)
        if not samples or run.resume.nothing_to_do:
            return
        settings = serving_settings(job)
        matching = candidates(samples, settings.manifest_settings())
        # The servers are asked what they run only where a sample's settings match.
        found = matching.served_by(servers_identity(settings) if matching.samples else None)
        for note in found.notes:
            job.say(note)
        run.reuse = found.reuse

    def stop(self, run: RunHandle) -> None:
        reuse, reused = run.reuse, run.summary.get("reused")
        if reuse is None:
            return
        if reused is not None:
            where = ", ".join(str(s.where) for s in reuse.sources)
            run.job.say(f"{reused:,} of the {run.summary.get('done', 0):,} answers are the "
                        f"estimate's ({where}), written without sending their rows again")
        if reuse.declined:
            run.job.say(f"{sum(reuse.declined.values()):,} of the estimate's answers were not "
                        f"reused, their rows sent: {reuse.declined_words()}")


def serving_settings(job: NodeJob) -> ProducerSettings:
    """The run's settings with the servers it runs on: the engines this node started, once
    they are up (their limits are the run's), else the --engine-url ones."""
    if job.fleet.engines is None:
        return job.settings
    return replace(job.settings, engine_url=tuple(job.fleet.serving_urls()))


def servers_identity(settings: ProducerSettings) -> dict[str, Any]:
    """What model the run's servers run, as producer/reuse.py compares it with an
    estimate's."""
    from producer.build import read_servers
    from producer.reuse import identity

    protocol, servers = read_servers(settings)
    return identity(protocol.name, servers)


class Produce:
    """The producer, opened here (the run is open before the drainer looks at it: a resumed
    run with --ignore-stop is not stopped any more), its pass and its wait in a thread; a run
    already complete and not grown has nothing to produce."""

    def start(self, run: RunHandle) -> None:
        from producer.build import build_producer
        from producer.loop import Plan

        job = run.job
        assert run.resume is not None
        if run.resume.nothing_to_do:
            return
        plan = Plan(job.inputs, waits=True, recorded=run.resume.recorded, reuse=run.reuse)
        producer = build_producer(serving_settings(job), client=run.redis, plan=plan)
        if not producer.open():
            return  # stopped by --stop-if before: the drainer finds it settled

        def work() -> None:
            # It stays until every row has an outcome, as `fleetgen produce` does: it builds
            # each next turn of --turns all, re-enqueues what Redis lost, and sweeps the
            # workers' own queues (first turns go there only while it stays).
            report = producer.send_pass(should_stop=run.should_stop)
            if report.stopped is None and not run.should_stop():
                producer.wait_until_generated(should_stop=run.should_stop)

        run.producer = Beside(work, wake=producer.wake)

    def stop(self, run: RunHandle) -> None:
        pass  # a daemon thread: it ends with the run or dies with the process


class UntilWritten:
    """The drainer's loop until every row is written: the bar, the engines' fall and return
    and the limits they run at, said where the run was started; then the summary."""

    def start(self, run: RunHandle) -> None:
        job, drainer = run.job, run.drainer
        assert drainer is not None
        job.say(f"run {job.settings.run}; watch it from another shell with\n"
                f"  FLEETGEN_REDIS_URL=$(cat {url_file(job)}) fleetgen status --run "
                f"{job.settings.run} --watch")
        bar = Bar("requests written", show=sys.stderr.isatty())
        look = Look(run, bar)
        try:
            for _ in drainer.ticks(should_stop=run.should_stop):
                if run.producer is not None:
                    run.producer.raise_error()
                look.tick()
            if run.producer is not None:
                run.producer.settle(run.should_stop())
        finally:
            if run.should_stop():
                shield_from_signals()  # the summary below is what the signal asked for
            bar.close()
        run.summary = drainer.write_summary()
        print(summary_table(run.summary, job.out))
        if run.should_stop():
            say_interrupted(job, run.summary["run"])

    def stop(self, run: RunHandle) -> None:
        pass


class Look:
    """What the terminal shows between two ticks of the drainer."""

    def __init__(self, run: RunHandle, bar: Bar) -> None:
        job = run.job
        self.run, self.bar = run, bar
        self.view = FleetView(run.redis, job.settings.run,
                              [job.fleet.engine_url(gpu) for gpu in range(job.fleet.spec.gpus)],
                              lambda text: bar.note(f"fleetgen {job.command}: {text}"))
        self.ticker = LogLine(job.say)
        self.engines_due = 0.0

    def tick(self) -> None:
        run, fleet = self.run, self.run.job.fleet
        drainer = run.drainer
        assert drainer is not None
        if fleet.engines is not None and time.monotonic() >= self.engines_due:
            self.engines_due = time.monotonic() + ENGINES_EVERY_S
            publish(run.redis, drainer.run, fleet.engines.views())
        total = drainer.manifest().rows
        self.view.look()
        up, engines = self.view.engines_up
        self.bar.advance_to(drainer.tally.written, total)
        note = fleet.engines.note() if fleet.engines is not None else ""
        self.bar.postfix(f"engines {up}/{engines}" + (f", {note}" if note else ""))
        self.ticker.tick(drainer.tally.written, total, in_flight=self.view.in_flight,
                         engines=self.view.engines_up, note=note)


class ReportPage:
    """The run as pictures, from the output files alone (as `fleetgen report`), and how it
    ended: stopped early by a rule, or complete with failed rows and how to send them again."""

    def start(self, run: RunHandle) -> None:
        from fleetgen.monitor.report import build

        job, summary = run.job, run.summary
        run.built = build(job.out, group_by=job.group_by)
        job.say(f"report at {run.built.out} ({run.built.size / 1024:.0f} KiB; open it in a "
                f"browser, it needs no network; again with `fleetgen report {job.out}`)")
        if summary.get("stopped"):
            job.say(f"stopped early: {summary['stopped']}; the requests sent before the stop "
                    f"are all written. Fix the settings and run it with another --out, or the "
                    f"same command plus --ignore-stop to go on")
        if summary["complete"] and summary.get("failed"):
            again = (f"send them again with: {job.retry_command}" if job.retry_command else
                     "each is kept there with its error")
            job.say(f"complete with {summary['failed']} failed row(s) (in "
                    f"{OutputDir(job.out).file(KIND_FAILURE)}); {again}")

    def stop(self, run: RunHandle) -> None:
        pass


class Close:
    """A complete run's own Valkey stops next: the workers that joined from other hosts exit
    and the live pages read the end before it does (fleetgen/queue/closing.py)."""

    def start(self, run: RunHandle) -> None:
        from fleetgen.queue import closing

        job = run.job
        if not run.summary["complete"] or job.fleet.spec.redis_url is not None:
            return
        own = [f"{name}@{socket.gethostname()}" for name in job.fleet.worker_names()]
        at = closing.announce(run.redis, job.settings.run)
        left = closing.wait_for_leavers(run.redis, own, at, should_stop=run.should_stop)
        if left.workers:
            job.say(f"worker(s) {', '.join(left.workers)} did not leave; stop them by hand "
                    "(the run is complete, they only retry its Redis)")

    def stop(self, run: RunHandle) -> None:
        pass


def url_file(job: NodeJob) -> Any:
    """Where the run's Redis URL (its password in it) is kept for `status` and the others,
    readable by the user alone: a secret is written to no terminal or log."""
    return job.state_dir / "redis.url"


def say_interrupted(job: NodeJob, run: str) -> None:
    job.say("interrupted; what is written is kept: " + (
        job.resume_hint or f"run the same command (same --out {job.out}) to resume run {run}"))


def send_failures_again(job: NodeJob, drainer: Drainer) -> None:
    """The rows the files hold as failures go back to work: their done bits cleared and
    listed as in retry (so the run is not complete until each lands again), before the
    producer's pass, which sends every row not done. The drainer stays the one writer: a
    success replaces the failure line (fleetgen/drainer/store.py)."""
    from fleetgen.runstate.lifecycle import mark_retrying

    lines = drainer.tally.lines_of(KIND_FAILURE)
    if lines:
        mark_retrying(drainer.redis, drainer.run, lines)
    job.say(f"sending {len(lines)} failed row(s) of run {drainer.run} again"
            if lines else f"run {drainer.run} has no failed rows to send again")
