"""`fleetgen status --serve`: a running run's live page, read from Redis alone, read-only and
behind basic auth (the convention Flower follows here: credentials from the environment, else
generated and printed once).

One thread samples the run every interval into a short history (the last minutes of rows/s,
tokens/s, queue depth and in flight), so the page shows rates over time even when it was opened
late; requests are answered from that memory, never by a Redis call of their own, so any number
of open pages cost Redis one `status` a period.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis

from fleetgen.errors import ConfigError
from fleetgen.monitor import status
from fleetgen.monitor.page import asset, embed_json, render
from fleetgen.queue import closing
from fleetgen.queue.contract import closing_key
from fleetgen.runstate.manifest import STATE_COMPLETE
from fleetgen.settings import envvars

log = logging.getLogger("fleetgen.status")

ENV_AUTH = envvars.STATUS_AUTH.name
DEFAULT_HOST = "127.0.0.1"  # the page is for whoever can reach the port: loopback unless told
WINDOW_S = 900.0  # the history the page draws: the last 15 minutes
# Figures older than this many sampling periods (and never less than STALE_MIN_S) are stale:
# the sampler is stuck on a Redis that does not answer (a client riding out an outage retries
# for about 30 s per call), and the page must say so instead of showing old figures as live.
STALE_PERIODS = 3
STALE_MIN_S = 5.0
# No network for the page but its own origin: scripts and styles are inline, data is fetched
# from here.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                               "style-src 'unsafe-inline'; connect-src 'self'; img-src data:",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str = field(repr=False)  # never in a repr or a log line

    def matches(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(
                ":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        # Both compared in constant time, and both always compared.
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_password = hmac.compare_digest(password.encode(), self.password.encode())
        return ok_user and ok_password


def credentials_from_env(env: dict[str, str] | None = None) -> tuple[Credentials, bool]:
    """`user:password` from FLEETGEN_STATUS_AUTH, or generated; and whether it was made up."""
    value = envvars.STATUS_AUTH.given(env)
    if not value:
        return Credentials("fleetgen", secrets.token_urlsafe(12)), True
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ConfigError(f"{ENV_AUTH} must be user:password (both non-empty)")
    return Credentials(user, password), False


def parse_listen(spec: str) -> tuple[str, int]:
    """`[HOST:]PORT` -> (host, port); the host defaults to loopback, port 0 is any free one."""
    host, sep, port = spec.rpartition(":")
    host = host.strip("[]") if sep else DEFAULT_HOST
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"--serve wants [HOST:]PORT with a port in 0..65535 (0: any free "
                          f"one), got {spec!r}")
    return host or DEFAULT_HOST, int(port)


class Sampler:
    """The run's status every `interval_s`, with the rates over the last interval, and a
    history of the last WINDOW_S."""

    def __init__(self, client: redis.Redis, run: str, interval_s: float = 2.0) -> None:
        self.client, self.run, self.interval_s = client, run, interval_s
        self.history: deque[dict[str, Any]] = deque(maxlen=max(int(WINDOW_S / interval_s), 2))
        self.latest: dict[str, Any] | None = None
        self.error: str | None = None
        self.sampled_at: float | None = None  # the last time Redis answered (epoch s)
        self._started_at = time.time()
        self.ended = False  # the run is complete and its Redis has closed (or is closing)
        self._id = secrets.token_hex(8)
        self._previous: status.RunStatus | None = None
        self._lock = threading.Lock()

    def sample(self) -> None:
        if self.ended:  # the run's Redis is gone: the last figures are its end
            return
        try:
            current = status.gather(self.client, self.run)
            ended = self._mark_read()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            with self._lock:
                self.error = f"Redis unreachable ({str(exc).splitlines()[0] if str(exc) else ''})"
            return
        with self._lock:
            self.sampled_at = time.time()
            # The run said its Redis stops next, and these figures are its end.
            self.ended = ended == self.run and current is not None \
                and current.state == STATE_COMPLETE
            self.error = None if current is not None else "no such run (yet) in this Redis"
            if current is None:
                return
            current = status.with_window(current, self._previous)
            self._previous = current
            self.latest = current.to_json()
            self.history.append(_point(current))

    def _mark_read(self) -> str | None:
        """This page's read, for a closing run to wait on (the page's one write, a key of
        its own); and whether the run's Redis is closing."""
        pipe = self.client.pipeline()
        closing.mark_watcher(pipe, self._id, self.interval_s)
        pipe.get(closing_key())
        return closing.closing(pipe.execute()[-1])

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """What the page shows; `error` also says when the figures are stale (no answer from
        Redis for STALE_PERIODS periods), `idle` when the run is not moving."""
        now = time.time() if now is None else now
        with self._lock:
            error = self.error
            last = self.sampled_at or self._started_at
            age_s = now - last
            if self.ended:
                error = None  # no figure to come: these are the run's last
            elif age_s > max(STALE_PERIODS * self.interval_s, STALE_MIN_S):
                since = time.strftime("%H:%M:%S", time.localtime(last))
                error = (f"no figures for {age_s:.0f} s (last read at {since}): "
                         f"{error or 'Redis does not answer'}; the figures below are old")
            return {"run": self.run, "interval_s": self.interval_s, "error": error,
                    "sampled_at": self.sampled_at, "ended": self.ended,
                    "idle": (self.latest or {}).get("idle") if error is None else None,
                    "status": self.latest, "history": list(self.history)}

    def loop(self, should_stop: Callable[[], bool]) -> None:
        while not should_stop():
            started = time.monotonic()
            self.sample()
            _wait(self.interval_s - (time.monotonic() - started), should_stop)


def _point(s: status.RunStatus) -> dict[str, Any]:
    return {"at": s.at, "rows_per_s": s.recent_rows_per_s, "tokens_per_s": s.recent_tokens_per_s,
            "queued": s.queued, "in_flight": s.in_flight, "done": s.done, "failed": s.failed}


def _wait(seconds: float, should_stop: Callable[[], bool]) -> None:
    """The sampling period itself (not a synchronisation), cut short by a stop."""
    deadline = time.monotonic() + max(seconds, 0)
    while not should_stop() and time.monotonic() < deadline:
        time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))


def page(run: str, interval_s: float) -> str:
    return render(f"fleetgen: run {run} (live)", {"kind": "live", "run": run,
                                                  "interval_s": interval_s},
                  extra_js=asset("live.js"))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], sampler: Sampler,
                 credentials: Credentials) -> None:
        self.sampler, self.credentials = sampler, credentials
        self.html = page(sampler.run, sampler.interval_s).encode()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a request's error, traceback and all, to stderr: over the
        operator's terminal, and into whatever else the process prints (a browser closing its
        tab resets the connection mid-answer; a test's captured stderr got one from a page
        a test before had left). A client gone away is logged at debug, anything else as a
        warning."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            log.debug("status page: %s went away (%s)", client_address, error)
        else:
            log.warning("status page: a request from %s failed", client_address,
                        exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "fleetgen"
    sys_version = ""

    def do_GET(self) -> None:
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, "text/html; charset=utf-8", self.server.html)
        elif path == "/status.json":
            self._send(HTTPStatus.OK, "application/json",
                       embed_json(self.server.sampler.snapshot()).encode())
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")

    def do_HEAD(self) -> None:
        self.do_GET()

    def _refuse(self) -> None:
        # Read-only: nothing here changes the run.
        if self._authorized():
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", b"read-only: GET only\n",
                       {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _authorized(self) -> bool:
        if self.server.credentials.matches(self.headers.get("Authorization")):
            return True
        self._send(HTTPStatus.UNAUTHORIZED, "text/plain", b"login required\n",
                   {"WWW-Authenticate": 'Basic realm="fleetgen status", charset="UTF-8"'})
        return False

    def _send(self, code: HTTPStatus, kind: str, body: bytes,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for name, value in {"Content-Type": kind, "Content-Length": str(len(body)),
                            **SECURITY_HEADERS, **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def make_server(sampler: Sampler, credentials: Credentials, host: str = DEFAULT_HOST,
                port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server answering GET / (the page) and GET /status.json; 401 without the login,
    405 for any method that is not GET or HEAD, 404 for any other path."""
    return _Server((host, port), sampler, credentials)


class LivePage:
    """The sampler and the server, each on a thread of its own; `stop()` ends both."""

    def __init__(self, client: redis.Redis, run: str, credentials: Credentials,
                 host: str = DEFAULT_HOST, port: int = 0, interval_s: float = 2.0) -> None:
        self.sampler = Sampler(client, run, interval_s)
        self.sampler.sample()  # the first figures are there before the first request
        self.server = make_server(self.sampler, credentials, host, port)
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self.sampler.loop, args=(self._stop.is_set,),
                             name="status-sampler", daemon=True),
            threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                             name="status-server", daemon=True)]

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> LivePage:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Within a second: the server at once; the sampler (a daemon) may be blocked on a
        Redis that does not answer, so it is given a moment, not waited for."""
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        sampler, server = self._threads
        server.join(timeout=5)
        sampler.join(timeout=0.5)
