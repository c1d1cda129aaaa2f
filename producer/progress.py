"""What one pass of the producer did, counted as it goes: rows read, requests enqueued,
rejected or skipped, rows re-enqueued after a loss, and why the run stopped early if it did."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    read: int = 0
    enqueued: int = 0
    rejected: int = 0
    held_out: int = 0  # requests of rows held out (--holdout): never sent
    reused: int = 0  # requests answered by an earlier answer (producer/reuse.py): never sent
    skipped: int = 0  # already done or in flight from an earlier invocation
    requeued: int = 0  # lost rows enqueued again while waiting (see wait_until_generated)
    stopped: str | None = None  # why --stop-if stopped the run, if it did
    started_s: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s
