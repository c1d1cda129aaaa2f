"""The worker's beat off Celery's consumer loop: a thread of its own renews the lease and writes
the heartbeat, and says at WARNING when the worker loses Valkey and when it has it back.

The consumer loop must never wait on the network (workers/gate.py): with the beat on it, a
cut link held the loop for the client's socket timeout and its retries (30 s each), so kombu's
own check of a stale BRPOP connection, on the same loop, ran only after the heal (issue 52).
The loop now reads `closing` and `lost` here; it never calls Valkey for the beat.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from celery import bootsteps

from fleetgen.queue.heartbeat import LOST_AFTER_BEATS

log = logging.getLogger("fleetgen.worker")


class Beat:
    """Calls `send` every `interval_s` on a daemon thread; `send` renews the lease, writes
    the heartbeat and returns the closing key's value. Valkey counts as lost once no beat has
    succeeded for LOST_AFTER_BEATS intervals: when `status` shows this worker LOST too."""

    def __init__(self, send: Callable[[], str | None], *, worker: str, interval_s: float,
                 lease_s: float, held: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send, self._held, self._clock = send, held, clock
        self.worker, self.interval_s, self.lease_s = worker, interval_s, lease_s
        self.closing: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok = clock()
        self._error = ""
        # The last good beat before an outage this worker has said; None while none is.
        self._down_since: float | None = None

    @property
    def lost_after_s(self) -> float:
        return LOST_AFTER_BEATS * self.interval_s

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fleetgen-beat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops beating; a beat waiting on the network is left to its timeout (daemon)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            self.once()
            self._stop.wait(max(self.interval_s - (self._clock() - started), 0.0))

    def once(self) -> None:
        """One beat, then what it changed said (the thread's body; a test calls it)."""
        try:
            closing = self._send()
        except Exception as exc:  # a beat must never end the thread
            with self._lock:
                self._error = f"{type(exc).__name__}: {exc}"
            log.debug("heartbeat failed", exc_info=True)
        else:
            with self._lock:
                self._last_ok, self.closing = self._clock(), closing
        self.check()

    def lost(self) -> bool:
        return self._clock() - self._last_ok > self.lost_after_s

    def check(self) -> None:
        """Says a loss once it is one (from the loop's timer, which runs while the beat thread
        waits on a dead link) and the return at the first beat that gets through."""
        with self._lock:
            now, last_ok, since = self._clock(), self._last_ok, self._down_since
            if since is None and now - last_ok > self.lost_after_s:
                self._down_since = last_ok
                error = self._error or "no reply"
            elif since is not None and last_ok > since:
                self._down_since = None
            else:
                return
        if since is None:
            log.warning(
                "fleetgen worker %s: Valkey lost: no heartbeat has reached it for %.0f s (%s); "
                "it holds %d prompt(s), kept running; their lease lapses %.0f s after the last "
                "heartbeat, then other workers take them", self.worker, now - last_ok, error,
                self._held(), self.lease_s)
            return
        down_s = last_ok - since  # from the last beat before the outage to the first after
        lapsed = (f"; its lease lapsed meanwhile ({down_s:.0f} s > {self.lease_s:.0f} s): what "
                  "it held may have gone to other workers, and its late answers are refused"
                  if down_s > self.lease_s else "; its lease held")
        log.warning("fleetgen worker %s: Valkey back after %.0f s without a heartbeat%s",
                    self.worker, down_s, lapsed)


class ThreadTimer:
    """What Celery's event heartbeat (`celery.worker.heartbeat.Heart`) asks of its timer, each
    entry on a daemon thread of its own instead of on the consumer loop."""

    def call_repeatedly(self, interval_s: float, fun: Callable[..., Any], args: Any = (),
                        priority: int = 0) -> _Repeat:
        return _Repeat(float(interval_s), fun, tuple(args))

    def cancel(self, tref: _Repeat) -> None:
        tref.cancel()


class _Repeat:
    def __init__(self, interval_s: float, fun: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._stop = threading.Event()
        self._interval_s, self._fun, self._args = interval_s, fun, args
        threading.Thread(target=self._run, name="fleetgen-event-heartbeat", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._fun(*self._args)
            except Exception:  # the next one retries, as on Celery's timer
                log.debug("event heartbeat failed", exc_info=True)

    def cancel(self) -> None:
        self._stop.set()


class EventHeartOffLoop(bootsteps.StartStopStep):
    """Celery's worker-heartbeat event (what Flower shows a worker online by) is a synchronous
    publish every 2 s on the consumer loop's timer: on a cut link it held the loop for the
    socket timeout and its retries (issue 52; measured: the loop's own checks stopped for the
    whole cut). Moved to a thread (`ThreadTimer`), here and whenever events are enabled again."""

    requires: ClassVar[set[str]] = {"celery.worker.consumer.heart:Heart"}

    def start(self, c: Any) -> None:
        heart = getattr(c, "heart", None)
        if heart is None:
            return
        running = heart.tref is not None
        if running:
            heart.timer.cancel(heart.tref)
        heart.timer = ThreadTimer()
        if running:
            heart.tref = heart.timer.call_repeatedly(heart.interval, heart._send,
                                                     ("worker-heartbeat",))
