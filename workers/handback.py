"""Hand back at shutdown: a worker stopped with SIGTERM finishes what it can within
FLEETGEN_HANDBACK_S, then returns the prompts it still holds to the queue and exits.

SIGTERM is Celery's warm shutdown, which waits for running tasks without limit, and the
threads pool cannot cancel one (`kill_job` is not implemented); a prompt on a slow server could
hold a stopping worker for FLEETGEN_REQUEST_TIMEOUT_S. So, past the grace period, the prompts
still unacked on this worker's channel are restored to the queue (kombu's
`QoS.restore_unacked`, what kombu itself does when a channel closes) and the process exits:
other workers take them at once, and a thread that finished meanwhile has set the row's done
bit, so its redelivery is skipped (exactly once either way).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, ClassVar

from celery import bootsteps, signals

from workers import runtime
from workers.state import state

log = logging.getLogger("fleetgen.worker")

class RememberConsumer(bootsteps.StartStopStep):
    """Keeps the consumer, whose channel holds the unacked messages to restore."""

    requires: ClassVar[set[str]] = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c: Any) -> None:
        state.consumer = c


@signals.worker_shutting_down.connect
def _on_shutting_down(exitcode: Any = None, **_: Any) -> None:
    if runtime.in_flight_count() == 0:
        return
    grace_s = runtime.get().settings.handback_s
    log.warning("stopping: %d prompt(s) running; handing back whatever is still running in "
                "%g s (FLEETGEN_HANDBACK_S)", runtime.in_flight_count(), grace_s)
    timer = threading.Timer(grace_s, hand_back, kwargs={"exitcode": exitcode})
    timer.daemon = True
    timer.start()


def hand_back(exitcode: Any = None) -> None:
    held = runtime.in_flight_count()
    if held == 0 or state.consumer is None:
        return
    failed = state.consumer.task_consumer.channel.qos.restore_unacked()
    log.warning("stopping: %d prompt(s) still running handed back to the queue%s", held,
                f" ({len(failed)} could not be restored)" if failed else "")
    logging.shutdown()
    os._exit(exitcode if isinstance(exitcode, int) else 0)
