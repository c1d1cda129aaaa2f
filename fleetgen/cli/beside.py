"""The producer's pass in a thread beside the drainer, the way the job runs them: an error the
thread raises is raised again by the drainer's side at its next tick."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetgen.drainer import Drainer


class Beside:
    """`work` (the producer) in a thread beside the drainer; an error it raises is kept for
    the drainer's loop (`raise_error`), which stops the command with it."""

    def __init__(self, work: Callable[[], object],
                 wake: Callable[[], None] = lambda: None) -> None:
        self.errors: list[BaseException] = []
        self._work = work
        self._wake = wake  # tells `work` that the drain is over (Producer.wake)
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

    def settle(self, stopped: bool) -> None:
        """After the drain: the thread is given a moment to end (stopped: it is a daemon and
        dies with the process), then its error, if any, is raised."""
        if not stopped:
            self._wake()
            self.thread.join(timeout=5)
        self.raise_error()


def drain_beside(drainer: Drainer, producer: Beside,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
    """The drainer here until the run is complete (or `should_stop`), the producer's error
    raised at the next tick; then the producer's thread is given a moment to end."""
    for _ in drainer.ticks(should_stop=should_stop):
        producer.raise_error()
    producer.settle(should_stop())
