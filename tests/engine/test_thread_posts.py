"""fleetgen/engine/http.py `ThreadPosts`: the generation POSTs sent straight to an httpx
transport per thread, against a real HTTP server on a socket: what reaches the server (headers,
body), the connection each thread keeps, and httpx's errors for a refused connection and a
timeout, as `Client.post` raised them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import httpx
import pytest

from fleetgen.engine.http import ThreadPosts
from fleetgen.local.ports import lease_port
from tests.support.httpd import serving

TIMEOUT = httpx.Timeout(0.5, connect=1.0)
# Tests that are not about the timeout wait as an engine's client would: a 0.5 s read timeout
# fired under a loaded CI (two xdist workers on two cores) and failed a test about connections.
PATIENT = httpx.Timeout(30.0, connect=10.0)


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as an engine's server
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Recorder.seen.append({"path": self.path, "headers": dict(self.headers), "body": body,
                              "peer": self.client_address[1]})
        if self.path == "/slow":
            time.sleep(5.0)
        reply = json.dumps({"echo": json.loads(body)}).encode()
        self.send_response(200 if self.path != "/bad" else 400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.seen = []
    with serving(Recorder) as url:
        yield url + "/"


def test_a_post_carries_its_headers_and_body_and_is_read_whole(server: str) -> None:
    posts = ThreadPosts(server, headers={"Authorization": "Bearer k"}, timeout=PATIENT)
    try:
        response = posts.post("/generate", b'{"a": 1}', {"X-Request-Id": "run:1:abc"})
        plain = posts.post("/generate", b'{"a": 2}')
    finally:
        posts.close()
    assert response.status_code == 200 and response.json() == {"echo": {"a": 1}}
    assert plain.json() == {"echo": {"a": 2}}
    assert response.request.url == httpx.URL(server.rstrip("/") + "/generate")
    first, second = Recorder.seen
    assert first["path"] == "/generate" and first["body"] == b'{"a": 1}'
    assert first["headers"]["Content-Type"] == "application/json"
    assert first["headers"]["Authorization"] == "Bearer k"
    assert first["headers"]["X-Request-Id"] == "run:1:abc"
    assert "X-Request-Id" not in second["headers"]  # one request's header is not the next's


def test_an_error_status_is_a_response_not_an_exception(server: str) -> None:
    posts = ThreadPosts(server, headers={}, timeout=PATIENT)
    try:
        response = posts.post("/bad", b'{"b": 1}')
    finally:
        posts.close()
    assert response.status_code == 400 and response.json() == {"echo": {"b": 1}}


def test_each_thread_keeps_one_connection_of_its_own(server: str) -> None:
    posts = ThreadPosts(server, headers={}, timeout=PATIENT)

    def three() -> None:
        for i in range(3):
            posts.post("/generate", json.dumps({"i": i}).encode())

    try:
        threads = [threading.Thread(target=three) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        posts.close()
    peers = [seen["peer"] for seen in Recorder.seen]
    assert len(peers) == 6
    assert len(set(peers)) == 2, "each thread reuses its one kept-alive connection"


def test_a_refused_connection_raises_httpx_connect_error() -> None:
    with lease_port() as nothing:  # free, and held from other tests while it runs
        posts = ThreadPosts(f"http://127.0.0.1:{nothing.port}", headers={}, timeout=TIMEOUT)
        with pytest.raises(httpx.ConnectError):
            posts.post("/generate", b"{}")
        posts.close()


def test_the_read_timeout_holds(server: str) -> None:
    posts = ThreadPosts(server, headers={}, timeout=TIMEOUT)
    started = time.monotonic()
    try:
        with pytest.raises(httpx.ReadTimeout):
            posts.post("/slow", b"{}")
    finally:
        posts.close()
    assert time.monotonic() - started < 4.0  # 0.5 s read timeout, not the server's 5 s


def test_threads_and_clients_share_the_process_ssl_context(server: str,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A new thread's transport (a worker's first prompt on each pool thread) and a new
    engine client make no SSL context of their own: loading the roots cost ~25 ms of CPU
    each, so 8 workers starting a run on 2 cores sent their first requests ~0.6 s late."""
    import ssl

    from fleetgen.engine import http as engine_http
    from fleetgen.engine.sglang import SGLangClient

    engine_http.ssl_context()  # the process's one, made before the count starts
    made: list[object] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    posts = ThreadPosts(server, headers={}, timeout=PATIENT)
    client = SGLangClient(server, timeout_s=30.0, concurrency=3)
    try:
        threads = [threading.Thread(target=posts.post, args=("/generate", b"{}"))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        posts.close()
        client.close()
    assert len(Recorder.seen) == 3
    assert made == []
