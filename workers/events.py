"""Celery's task events, when a worker sends them (`celery worker -E`, or Flower's
`enable_events` broadcast: off by default, fleetgen/queue/celeryconf.py), published off the
consumer loop (issue 52).

Celery's worker buffers the events of the task group (`celery/worker/consumer/events.py`
`Events.start`: `buffer_group=['task'] if c.hub else None,
on_send_buffered=c.on_send_event_buffered if c.hub else None`), and has the loop publish them
(`celery/worker/consumer/consumer.py`):

    def on_send_event_buffered(self):
        if self.hub:
            self.hub.call_soon(self._flush_events_promise)

so `task-received` (sent from the loop itself, `celery/worker/strategy.py`), `task-started`
and `task-succeeded` (sent from the pool's threads) were each a synchronous publish on the
loop (`EventDispatcher.flush`, a Redis PUBLISH per batch): a slow or cut Valkey held the loop
for the client's socket timeout and retries, once per message. `EventFlushOffLoop` hands the
flush to a thread of its own instead; the dispatcher's lock (`EventDispatcher.mutex`) already
serialises it with the worker-heartbeat event's publish (workers/beat.py `EventHeartOffLoop`,
on a thread too), and Celery's flush clears only what it published, other threads appending
meanwhile. The dispatcher's own flush at `buffer_limit` (24 buffered events: `send` calls
`self.flush()` in the sender's thread, the loop for `task-received`) is pushed out of reach,
so a flush stuck on a cut link never holds the loop behind the dispatcher's lock; what
accumulates meanwhile is the events of the few messages a worker takes while its link is
down (a take is a write to Valkey too).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

from celery import bootsteps

log = logging.getLogger("fleetgen.worker")

# `EventDispatcher.buffer_limit` here: the flush thread publishes what is buffered as soon as
# it is woken, so this bound is only reached while it waits on a cut link.
BUFFER_LIMIT = 100_000


class EventFlusher:
    """Flushes the current dispatcher's buffered events on a daemon thread each time it is
    woken (`wake`, the dispatcher's `on_send_buffered`); one a process, following the
    dispatcher Celery makes again at each consumer restart."""

    def __init__(self) -> None:
        self._dispatcher: Any = None
        self._woken = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def follow(self, dispatcher: Any) -> None:
        with self._lock:
            self._dispatcher = dispatcher
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleetgen-events",
                                                daemon=True)
                self._thread.start()

    def wake(self) -> None:
        self._woken.set()

    def _run(self) -> None:
        while True:
            self._woken.wait()
            self._woken.clear()
            dispatcher = self._dispatcher
            try:
                # Celery's `Consumer._flush_events`: `self.event_dispatcher.flush()`.
                dispatcher.flush()
            except Exception:  # as on Celery's loop: the next wake publishes what is left
                log.debug("task events not published", exc_info=True)


FLUSHER = EventFlusher()


class EventFlushOffLoop(bootsteps.StartStopStep):
    """Gives the flush of the worker's buffered task events to `FLUSHER` (module docstring),
    after each start of Celery's `Events` step (it makes a new dispatcher)."""

    requires: ClassVar[set[str]] = {"celery.worker.consumer.events:Events"}

    def start(self, c: Any) -> None:
        dispatcher = getattr(c, "event_dispatcher", None)
        if dispatcher is None or dispatcher.on_send_buffered is None:  # no loop: no buffer
            return
        FLUSHER.follow(dispatcher)
        dispatcher.on_send_buffered = FLUSHER.wake
        dispatcher.buffer_limit = BUFFER_LIMIT
