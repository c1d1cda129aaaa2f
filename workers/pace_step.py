"""The pace step: a Celery consumer step that holds the worker's prefetch count (how many
prompts it takes from the queue and runs at once) at its in-flight limit (workers/pacing.py)."""

from __future__ import annotations

from typing import Any, ClassVar

from celery import bootsteps

from workers.pacing import PACE_EVERY_S
from workers.state import state


class PaceStep(bootsteps.StartStopStep):
    """Runs on Celery's consumer loop, so it never waits on the network: the pacing thread
    reads the engine; this step only copies its last limit into the consumer's QoS, which
    the Redis transport keeps in memory (kombu `QoS.can_consume`: no more deliveries while
    `prefetch_count` messages are unacked). With late acks and the pool at the limit's
    ceiling, what the worker holds is what it runs."""

    requires: ClassVar[set[str]] = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._tref: Any = None

    def start(self, c: Any) -> None:
        pacing = state.pacing
        if pacing is None:  # a limit fixed by -c before the engine answered: Celery's own
            return
        self.apply(c)  # before the loop's first fetch: the pool's size is only the ceiling
        pacing.start()
        self._tref = c.timer.call_repeatedly(PACE_EVERY_S, self.apply, (c,), priority=10)

    def stop(self, c: Any) -> None:
        if self._tref is not None:
            self._tref.cancel()
            self._tref = None

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        if state.pacing is not None:
            state.pacing.stop()

    @staticmethod
    def apply(c: Any) -> None:
        qos = c.qos
        if state.pacing is None or qos is None:
            return
        limit = state.pacing.current.limit
        if qos.value != limit:
            # `value` is what the loop keeps the channel at (`if qos.prev != qos.value:
            # update_qos()`, celery/worker/loops.py); set here, on the loop, and applied now.
            qos.value = limit
            qos.update()
