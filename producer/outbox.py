"""Where requests leave the producer: a pass's batches (first turns) to the queue's tail, next
turns of `--turns all` to the front of a queue, rejections to the stream; each counted in the
current pass's Progress."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetgen.queue.contract import TaskPayload
from producer.affinity import Affinity
from producer.enqueue import Enqueuer
from producer.progress import Progress


class Outbox:
    def __init__(self, enqueuer: Enqueuer, affinity: Affinity) -> None:
        self.enqueuer = enqueuer
        self.affinity = affinity
        self.progress = Progress()

    def new_pass(self) -> Progress:
        """A pass counts from zero; the last pass's Progress is left as it was (the run's
        report is the first pass's)."""
        self.progress = Progress()
        return self.progress

    def send_first(self, payloads: list[TaskPayload], rejections: list[dict[str, Any]]) -> None:
        """One batch of a pass over the input: every request of `--turns last`, the first
        turns of `--turns all`. The one place first turns are sent: those sharing a prefix
        with others to one worker's queue (producer/affinity.py `first_routes`)."""
        self.enqueuer.reject(rejections)
        self.enqueuer.send(payloads, self.affinity.first_routes(payloads))
        self._count(payloads, rejections)

    def hold_out(self, records: list[dict[str, Any]]) -> None:
        """Held-out rows (--holdout): their lines to the stream, never to a queue."""
        self.enqueuer.hold_out(records)
        self.progress.held_out += sum(int(r.get("slots", 1)) for r in records)

    def reuse(self, records: list[dict[str, Any]]) -> None:
        """Earlier answers written as this run's (producer/reuse.py): to the stream, as
        results, never to a queue."""
        self.enqueuer.reuse(records)
        self.progress.reused += len(records)

    def send_next(self, payloads: list[TaskPayload], rejections: list[dict[str, Any]],
                  answered_by: Mapping[int, str | None]) -> int:
        """Next turns, each to the worker that answered the turn before where it has room
        (producer/affinity.py); returns how many were sent or rejected."""
        self.enqueuer.reject(rejections)
        self.enqueuer.send_next(payloads, self.affinity.routes(payloads, answered_by))
        self._count(payloads, rejections)
        return len(payloads) + len(rejections)

    def _count(self, payloads: list[TaskPayload], rejections: list[dict[str, Any]]) -> None:
        self.progress.enqueued += len(payloads)
        self.progress.rejected += len(rejections)
