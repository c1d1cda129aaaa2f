"""One producer run, start to end, without a terminal: whether the run resumes (its file list,
whether it is already complete, whether its input grew since), the pass over the input, and
the wait until every row has an outcome. `fleetgen produce` shows it through `Hooks`
(messages, progress bars, SIGTERM); the demo and the tests call the same function."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis

from fleetgen.queue.redisconn import connect
from fleetgen.runstate.lifecycle import run_complete
from producer.build import build_producer
from producer.inputs import Inputs, resolve_input
from producer.loop import Plan
from producer.manifest import CheckedManifest, Recorded, recorded_in
from producer.progress import Progress
from producer.settings import ProducerSettings


@dataclass(frozen=True)
class Resume:
    """What the run's state says about starting it (again)."""

    complete: bool  # every row of the run already has an outcome
    size_bytes: int  # the input's size now
    grown_from: int | None = None  # complete, but the input changed since: its size then
    # What the output directory's summary.json says of the run, read once here: the producer
    # opens the run against it (its pinned settings, its clock).
    recorded: Recorded | None = None

    @property
    def nothing_to_do(self) -> bool:
        return self.complete and self.grown_from is None


def check_resume(settings: ProducerSettings, inputs: Inputs, client: redis.Redis) -> Resume:
    """ConfigError for a resume that finds another file list or other pinned settings than
    the run was started on. It needs only Redis: a caller that starts servers and workers for
    the run calls it first, so a mismatch is one line before anything else is started.
    `inputs` and `client`: the run's, as its caller resolved and connected them, once."""
    size = inputs.size_bytes()
    pinned = settings.manifest_settings(files=inputs.names)
    recorded = recorded_in(settings.out, settings.run)
    # Before "already complete": a finished run given a new file or other settings must say
    # so, also once its Redis state is gone (then its files' summary holds them).
    manifest = CheckedManifest(client, settings.run, settings.new_run, recorded)
    changed = manifest.check_resume(inputs.names, pinned, size)
    complete = run_complete(client, settings.run)
    return Resume(complete, size, changed if complete else None, recorded)


class Hooks(Protocol):
    """What a caller sees of a run and how it stops it: `Quiet` for the demo's thread and the
    tests, the terminal's for `fleetgen produce` (fleetgen/cli/produce.py)."""

    def resuming(self, resume: Resume) -> None:
        """The run's state is known; nothing is built yet."""

    def stop_flag(self) -> Callable[[], bool]:
        """Called once the producer is built: what tells the run to stop between batches."""
        ...

    def read(self, rows: int, total: int) -> None:
        """Rows read so far, of the input's total: while the pass reads, a total projected
        from the bytes read (the input is not counted beforehand); at its end, the count."""

    def generated(self, rows: int, total: int) -> None:
        """Rows with an outcome so far, of the run's total, while waiting for the run."""

    def close(self) -> None:
        """The run has ended, or failed."""


class Quiet:
    """Shows nothing; never stops the run."""

    def resuming(self, resume: Resume) -> None:
        pass

    def stop_flag(self) -> Callable[[], bool]:
        return lambda: False

    def read(self, rows: int, total: int) -> None:
        pass

    def generated(self, rows: int, total: int) -> None:
        pass

    def close(self) -> None:
        pass


def produce(settings: ProducerSettings, *, wait: bool = False,
            reconcile_interval_s: float = 30.0, hooks: Hooks | None = None) -> Progress:
    """Build the producer and run it; with `wait`, stay until every row has an outcome,
    re-enqueueing rows lost on the way. A run already complete (and not grown) is nothing to
    do: an empty Progress."""
    hooks = hooks or Quiet()
    # The process's input and Redis client, made once here: the resume check and the run
    # share them (InputError for a missing input or an empty glob, before connecting).
    inputs = resolve_input(settings.input)
    assert settings.redis_url is not None, "produce() connects to its Redis: give its URL"
    client = connect(settings.redis_url)
    resume = check_resume(settings, inputs, client)
    hooks.resuming(resume)
    if resume.nothing_to_do:
        return Progress()
    # Rows appended to a finished run's file are rows to generate, not "nothing to do": the
    # pass below skips every row already done and sends the rest.
    producer = build_producer(settings, client=client,
                              plan=Plan(inputs, waits=wait, recorded=resume.recorded))
    # SIGTERM (the CLI's flag): stop between batches, or between two looks at the run while
    # waiting.
    should_stop = hooks.stop_flag()
    try:
        report = producer.send_pass(on_batch=lambda p: hooks.read(p.read, projected_rows(
            p.read, inputs.meter.bytes_read, resume.size_bytes)), should_stop=should_stop)
        if report.stopped is None and not should_stop():
            hooks.read(report.read, report.read)  # all read: the count is the total
        if wait and not should_stop() and report.stopped is None:
            report.requeued = producer.wait_until_generated(
                reconcile_interval_s, should_stop=should_stop, on_tick=hooks.generated)
    finally:
        hooks.close()
    return report


def projected_rows(rows: int, bytes_read: int, size_bytes: int) -> int:
    """The input's rows as the bytes read so far project them (a progress bar's total and ETA
    without a count beforehand, which would read the whole input once more)."""
    if bytes_read <= 0 or size_bytes <= bytes_read:
        return rows
    return max(rows, round(rows * size_bytes / bytes_read))
