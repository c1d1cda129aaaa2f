"""The readiness probe every fleetgen part uses (worker health gate, local fleet, `check`,
`doctor`): one quick GET that tells ready, not ready, refused and slow apart; and `Watch`, which
repeats it on a thread of its own and says when a server is gone.

SGLang 0.5.23's `/health` is a generation probe (http_server.py `health_generate`: it submits
a request and polls once a second, so every call takes >= 1 s and up to 20 s before a 503);
its `/ready` is the instant check (http_server.py `ready`: 200 only when up, not paused and
not exiting). SGLang's router serves `/readiness` instead; servers that have neither answer
`/health` quickly. So: the first of the registered kinds' paths (`EngineKind.ready_paths`,
fleetgen/engine/kinds.py) that is not a 404.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from fleetgen.engine.http import server_client
from fleetgen.engine.kinds import ready_paths


class State(enum.Enum):
    READY = "ready"  # 200
    NOT_READY = "not_ready"  # answered, not 200 (loading, paused, draining, exiting)
    REFUSED = "refused"  # no connection: the server is not there
    SLOW = "slow"  # connected, no answer in time: busy, not gone


@dataclass(frozen=True)
class Readiness:
    """What one readiness probe found: the state, and the path and answer that tell it."""

    state: State
    detail: str

    @property
    def ready(self) -> bool:
        return self.state is State.READY

    @property
    def up(self) -> bool:
        """Ready, or slow but connected: busy, not gone."""
        return self.state in (State.READY, State.SLOW)


def probe(http: httpx.Client, timeout_s: float = 2.0, paths: tuple[str, ...] = (),
          ) -> tuple[Readiness, str | None]:
    """Probe with `http` (its base URL is the server) at `paths`, by default every kind's.
    Returns the result and the path that answered, to be passed back as `paths=(path,)` next
    time."""
    paths = paths or ready_paths()
    for path in paths:
        try:
            response = http.get(path, timeout=timeout_s)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return Readiness(State.REFUSED, f"{path}: cannot connect ({type(exc).__name__})"), None
        except httpx.TimeoutException:
            return Readiness(State.SLOW, f"{path}: no answer within {timeout_s:g} s"), path
        except httpx.HTTPError as exc:
            return Readiness(State.REFUSED, f"{path}: {type(exc).__name__}"), None
        if response.status_code == 404 and path != paths[-1]:
            continue
        if response.status_code == 200:
            return Readiness(State.READY, f"{path} 200"), path
        return Readiness(State.NOT_READY, f"{path} answered {response.status_code}"), path
    return Readiness(State.NOT_READY, "no readiness endpoint"), None


class Prober:
    """Probes one server again and again, remembering the path it answers (SGLang `/ready`,
    a router `/readiness`, others `/health`), so later probes ask that path alone."""

    def __init__(self, http: httpx.Client, timeout_s: float = 2.0) -> None:
        self._http = http
        self.timeout_s = timeout_s
        self._paths: tuple[str, ...] = ()  # every kind's, until one answers

    def __call__(self) -> Readiness:
        result, path = probe(self._http, self.timeout_s, self._paths)
        # Only a path that said ready is the server's own: a loading llama-server answers
        # 503 on every path, `/ready` too, which it answers 404 once it serves.
        if path is not None and result.ready:
            self._paths = (path,)
        return result


def probe_url(base_url: str, timeout_s: float = 2.0, api_key: str | None = None) -> Readiness:
    """One probe of a server by URL (health endpoints need no API key on SGLang, but a
    router or proxy in front may want one)."""
    with server_client(base_url, api_key=api_key) as http:
        return probe(http, timeout_s)[0]


class Watch:
    """Probes one server every `interval_s` on a daemon thread and keeps the last answer, so
    readers (the worker's health gate on Celery's consumer loop) never wait on the network.

    Slow is not gone: a server that accepted the connection but answers late is busy. Gone is
    REFUSED or NOT_READY without a break for longer than `gone_after_s`, or not once up since
    the watch started (a server still loading its weights takes no prompts)."""

    def __init__(self, base_url: str, *, interval_s: float, gone_after_s: float,
                 timeout_s: float = 2.0, api_key: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._http = server_client(base_url, api_key=api_key)
        self._interval_s = interval_s
        self._gone_after_s = gone_after_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._probe = Prober(self._http, timeout_s)
        self._last = Readiness(State.NOT_READY, "not probed yet")
        self._up_until: float | None = None  # when it was last seen up; None: not yet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def last(self) -> Readiness:
        return self._last

    def up(self) -> bool:
        """Ready, or slow but connected."""
        return self._last.up

    def gone(self) -> bool:
        if self.up():
            return False
        if self._up_until is None:
            return True
        return self._clock() - self._up_until > self._gone_after_s

    def down_for_s(self) -> float:
        """Seconds since the server was last seen up (0 while it is up)."""
        if self.up() or self._up_until is None:
            return 0.0
        return self._clock() - self._up_until

    def check(self) -> Readiness:
        """One probe now (the thread calls this; so may a caller that must not wait)."""
        result = self._probe()
        if result.up:
            self._up_until = self._clock()
        self._last = result
        return result

    def start(self) -> None:
        """Probe once now, so the first reader sees a real answer, then keep probing."""
        if self._thread is not None:
            return
        self.check()
        self._thread = threading.Thread(target=self._run, name="fleetgen-engine-watch",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timeout_s + 1)
        self._http.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.check()
            except Exception as exc:  # a probe bug must not end the watch and freeze its state
                self._last = Readiness(State.NOT_READY, f"probe failed: {exc!r}")
