"""The shapes of a job on one node (`fleetgen run`, `fleetgen demo`; fleetgen/cli/job.py runs it):
what its command asked for, resolved once (`NodeJob`); a step (`Step`); and the run as the
steps share it, each resource made once (`RunHandle`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import redis

from fleetgen.local.fleet import LocalFleet

if TYPE_CHECKING:
    from fleetgen.cli.beside import Beside
    from fleetgen.drainer import Drainer
    from fleetgen.monitor.report import Built
    from producer.inputs import Inputs
    from producer.reuse import EarlierAnswers
    from producer.runner import Resume
    from producer.settings import ProducerSettings


@dataclass
class NodeJob:
    """What the command asked for, resolved once by it: nothing here is made again below."""

    command: str  # "run" or "demo": the name its messages carry
    fleet: LocalFleet  # not started yet
    settings: ProducerSettings  # no Redis URL: the run-state step connects, once
    inputs: Inputs  # the input, resolved once by the command
    out: Path
    state_dir: Path  # the embedded Valkey's data, kept until the run is complete
    resumed: bool
    # Steps of the command's own: once Redis is up (Flower, the line for other hosts'
    # workers), and once the report is written (the acceptance lines, the demo's linger).
    after_redis: list[Step] = field(default_factory=list)
    after_report: list[Step] = field(default_factory=list)
    check_engines: bool = False  # `fleetgen run`: each started engine passes the pre-flight
    # `fleetgen run --retry-failures`: the rows in failures.jsonl are sent again; and the
    # command that does it, for the last line of a run that ends with failures.
    retry_failures: bool = False
    retry_command: str | None = None
    group_by: str | None = None  # the report's extra breakdown of acceptance (a row field)
    # What resumes it, where that is not this command with this --out (the estimate's sample
    # run: its --out is the estimate's scratch directory, which the user never typed).
    resume_hint: str | None = None
    # `fleetgen run`: the directories (estimates' --out) whose samples' answers the run writes
    # as its own where they stand for its requests (producer/reuse.py); empty: none.
    reuse_from: tuple[Path, ...] = ()

    def say(self, text: str) -> None:
        print(f"fleetgen {self.command}: {text}", flush=True)


@dataclass
class RunHandle:
    """The run in this process: each resource made once, by the step that owns it, and read by
    the steps after it."""

    job: NodeJob
    should_stop: Callable[[], bool]
    client: redis.Redis | None = None  # the run's Redis, one connection pool for all threads
    resume: Resume | None = None
    drainer: Drainer | None = None
    producer: Beside | None = None
    summary: dict[str, Any] = field(default_factory=lambda: {"complete": False})
    built: Built | None = None  # the report, once written
    reuse: EarlierAnswers | None = None  # the earlier answers the producer writes, if any stand

    @property
    def redis(self) -> redis.Redis:
        assert self.client is not None, "the run-state step connects first"
        return self.client

    @property
    def hurry(self) -> bool:
        """Stopped by a signal: everything goes within 2 s, not with a 15 s grace."""
        return self.should_stop()

    @property
    def grace_s(self) -> float:
        return 0.5 if self.hurry else 15.0


class Step(Protocol):
    def start(self, run: RunHandle) -> None: ...

    def stop(self, run: RunHandle) -> None: ...
