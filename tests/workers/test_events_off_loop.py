"""The worker's buffered task events (when enabled) are published on a thread of their own,
never by the thread that sends them (Celery's consumer loop for `task-received`):
workers/events.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from workers.events import BUFFER_LIMIT, EventFlushOffLoop


class _Dispatcher:
    """What the step reads of Celery's `EventDispatcher`; its flush waits, as a publish on a
    cut link does, until the test lets it go."""

    def __init__(self) -> None:
        self.on_send_buffered = lambda: self.flush()  # Celery's: a flush on the loop
        self.buffer_limit = 24
        self.go = threading.Event()
        self.flushed_on: list[str] = []

    def flush(self) -> None:
        self.go.wait(10)
        self.flushed_on.append(threading.current_thread().name)


def test_a_buffered_event_is_published_off_the_sending_thread() -> None:
    dispatcher = _Dispatcher()
    EventFlushOffLoop(SimpleNamespace()).start(SimpleNamespace(event_dispatcher=dispatcher))
    assert dispatcher.buffer_limit == BUFFER_LIMIT
    started = time.monotonic()
    dispatcher.on_send_buffered()  # what `EventDispatcher.send` calls after buffering
    # A flush on this thread would wait the 10 s of `go`; 5 s of bound leaves room for a stall.
    assert time.monotonic() - started < 5.0, "the sender waited for the publish"
    assert dispatcher.flushed_on == []
    dispatcher.go.set()
    deadline = time.monotonic() + 5
    while not dispatcher.flushed_on and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dispatcher.flushed_on == ["fleetgen-events"]


def test_no_buffer_no_change() -> None:
    """A consumer without Celery's event loop buffers nothing (`on_send_buffered` None)."""
    dispatcher = SimpleNamespace(on_send_buffered=None, buffer_limit=24)
    EventFlushOffLoop(SimpleNamespace()).start(SimpleNamespace(event_dispatcher=dispatcher))
    assert dispatcher.on_send_buffered is None and dispatcher.buffer_limit == 24
