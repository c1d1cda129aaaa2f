"""How long this worker's engine has answered nothing while its requests time out: the
worker's half of the supervisor's rule for an engine that hangs with its health check passing
(fleetgen/local/silence.py reads it from the heartbeat as `silent_s`).

Any HTTP answer to a generation (a result, a 400, a 503, an abort) proves the engine's
generate path is alive and ends a silence; only a request that timed out starts one. A busy
server answers late but answers, so its silence keeps ending; a connection refused is neither
(the health check sees that)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fleetgen import errors


class Silence:
    """Since when every request has timed out and none was answered; thread-safe (the
    worker's threads call it, its beat thread reads it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # the first timeout after the last answer

    def answered(self) -> None:
        with self._lock:
            self._since = None

    def timed_out(self) -> None:
        with self._lock:
            if self._since is None:
                self._since = self._clock()

    def heard(self, error: errors.EngineError | None) -> None:
        """One engine call's end: `error` None for a result, else what it raised."""
        if error is None or error.status is not None:
            self.answered()
        elif isinstance(error, errors.EngineTimeout):
            self.timed_out()

    def silent_s(self) -> float:
        """Seconds since the first timeout not followed by an answer; 0 when there is none."""
        with self._lock:
            since = self._since
        return 0.0 if since is None else self._clock() - since
