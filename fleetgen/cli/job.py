"""The whole job on one node, the one code path of `fleetgen run` (real servers) and `fleetgen
demo` (simulated ones), as a list of steps started in order and stopped in reverse
(fleetgen/cli/steps.py; docs/architecture.md draws them):

    Valkey → run state → [Flower | the line for other hosts] → engines → workers → drainer →
    the estimate's answers → producer → progress → report → [acceptance | linger] → close

Stopped by Ctrl-C or SIGTERM within 2 s, and resumed by the same command."""

from __future__ import annotations

import shutil
import signal

import redis

from fleetgen import exitcodes
from fleetgen.cli import steps
from fleetgen.cli.nodejob import NodeJob, RunHandle, Step
from fleetgen.cli.signals import Stopped, shield_from_signals, sigterm_flag
from fleetgen.cli.steps import WORKERS_READY_S
from fleetgen.records import diskfull

__all__ = ["STOP_GRACE_S", "WORKERS_READY_S", "NodeJob", "execute", "job_steps",
           "shield_from_signals"]

# After Ctrl-C or SIGTERM the command must be gone within 2 s: past this grace the handler
# interrupts whatever still blocks (starting the fleet, a Redis call riding out an outage);
# the summary and the cleanup that follow are shielded from it (`shield_from_signals`).
STOP_GRACE_S = 1.5


def job_steps(job: NodeJob) -> list[Step]:
    """The job, in order: read this list to know what a run does."""
    return [steps.Valkey(), steps.RunState(), *job.after_redis, steps.Engines(),
            steps.Workers(), steps.Drain(), steps.EstimateAnswers(), steps.Produce(),
            steps.UntilWritten(), steps.ReportPage(), *job.after_report, steps.Close()]


def execute(job: NodeJob) -> int:
    """Run the job to its end (or its stop); exit code as `main` expects it."""
    # Ctrl-C and SIGTERM alike: the drainer stops within half a second, the summary is
    # written, and everything started is stopped with a short grace (what the workers held
    # goes back to the queue at the next start: `requeue_unacked`).
    run = RunHandle(job, sigterm_flag(grace_s=STOP_GRACE_S,
                                      signums=(signal.SIGTERM, signal.SIGINT)))
    fleet = job.fleet
    engines = "simulated GPUs" if job.command == "demo" else "engines"
    job.say(f"{'resuming' if job.resumed else 'starting'} run {job.settings.run}: Valkey, "
            f"{fleet.spec.gpus} {engines} and {len(fleet.worker_names())} workers ...")
    started: list[Step] = []
    try:
        for step in job_steps(job):
            if run.should_stop():
                break
            started.append(step)  # before its start: a step that fails half-way is stopped
            step.start(run)
    except redis.ResponseError as exc:
        # MISCONF: the run's Redis cannot write its data (a full disk, most often): one line
        # naming where, as for the output files (fleetgen/records/diskfull.py).
        full = diskfull.from_redis_error(exc, None if fleet.spec.redis_url else job.state_dir)
        if full is None:
            raise
        raise full from None
    finally:
        shield_from_signals()
        stop_in_reverse(started, run)
    return _exit_code(run)


def stop_in_reverse(started: list[Step], run: RunHandle) -> None:
    """Every step started, last first, each whatever the one before raised; the first error
    is raised once all are stopped."""
    errors: list[BaseException] = []
    for step in reversed(started):
        try:
            step.stop(run)
        except Exception as exc:  # the others must still stop; raised below
            errors.append(exc)
    if errors:
        raise errors[0]


def _exit_code(run: RunHandle) -> int:
    job, summary = run.job, run.summary
    if summary["complete"]:
        shutil.rmtree(job.state_dir, ignore_errors=True)  # nothing left to resume
    if run.should_stop():
        # Said how to resume already (the progress step): main exits 130 without a line of
        # its own; stopped before that (the fleet starting), main says it.
        raise Stopped if "run" in summary else KeyboardInterrupt
    # Failed rows are rows the user asked for and does not have: not a success (the last
    # line said how many, and how to send them again).
    succeeded = summary["complete"] and not summary.get("failed")
    return exitcodes.OK if succeeded else exitcodes.INCOMPLETE
