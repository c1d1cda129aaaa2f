"""HTTP at the engine boundary: the error bodies read, the clients made, the generation POSTs
sent. What a status or an httpx exception means is fleetgen/engine/decision.py's table, for every
protocol (engines differ in what their 400s mean, not in how a timeout looks)."""

from __future__ import annotations

import functools
import ssl
import threading
from typing import Any

import httpx
import orjson

from fleetgen.engine.decision import from_status, from_transport, not_json

# The header of a body serialized with orjson (`content=`), as httpx's `json=` would set it.
JSON_HEADERS = {"Content-Type": "application/json"}
# httpx's own default timeout, for a client whose calls each say their own.
HTTPX_TIMEOUT_S = 5.0


def error_message(response: httpx.Response) -> str:
    """The message of SGLang's native, HTTPException or OpenAI error bodies, else the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in body:
            return str(body["message"])
    return str(body)[:500]


def response_json(response: httpx.Response) -> Any:
    """The body as JSON: orjson (~5x the stdlib on an answer), the stdlib's reading for what
    orjson refuses (a server that writes NaN or Infinity, as Python's json module does).
    ValueError if it is not JSON at all."""
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.json()


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """The one SSL context of this process, as httpx makes its default (certifi's roots, or
    SSL_CERT_FILE / SSL_CERT_DIR), shared by every client and transport it makes: each of
    those made its own (loading the roots, ~25 ms of CPU) even for a plain http:// engine, so
    a worker's first prompt on each pool thread waited for one, and 8 workers starting a run
    together on 2 cores sent their first requests ~0.6 s after taking them (issue 48). An
    SSLContext may be shared by threads."""
    return httpx.create_ssl_context()


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def server_client(base_url: str, *, api_key: str | None = None,
                  timeout_s: float = HTTPX_TIMEOUT_S) -> httpx.Client:
    """A client of one server for a few reads (its limits, probes, doctor's checks): the base
    URL without its trailing slash, the API key as a bearer token."""
    return httpx.Client(base_url=base_url.rstrip("/"), headers=auth_headers(api_key),
                        timeout=timeout_s, verify=ssl_context())


def optional_json(http: httpx.Client, path: str) -> Any:
    """GET a JSON document, or None for any status but 200 or a body that is not JSON (an
    endpoint some engines have and others do not). Transport errors propagate."""
    response = http.get(path)
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def get_json(http: httpx.Client, path: str) -> Any:
    """GET a JSON document; EngineError for anything but a 200 with JSON."""
    try:
        response = http.get(path)
    except httpx.HTTPError as exc:
        raise from_transport(exc) from exc
    if response.status_code != 200:
        raise from_status(response.status_code, error_message(response))
    try:
        return response.json()
    except ValueError as exc:
        raise not_json(path, exc) from exc


def positive_int(value: Any) -> int | None:
    """A server's figure (a JSON value) if it is a positive integer, else None: servers report
    0, null or a boolean where they have no limit to give."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


class ThreadPosts:
    """The generation POSTs of a pool of threads that each hold one request at a time: one
    `httpx.HTTPTransport` per calling thread, each with one kept-alive connection, and each
    request handed straight to it.

    A single Client shared by 128 threads cost every request a scan of the whole pool under
    one lock (httpcore `ConnectionPool._assign_requests_to_connections` polls every idle
    socket for expiry): about 15 % of a worker's CPU at -c 33. And `Client.send` wraps the
    transport in layers a generation never uses (auth flow, redirects, cookie jar through
    `urllib.request`, event hooks, base-URL merging): sent to the transport itself, a request
    costs 0.55-0.68 x the Client's CPU (`python -m bench.http_client`). What remains is
    httpx's own: its `Request`, its transport and connection pool, h11."""

    def __init__(self, base_url: str, *, headers: dict[str, str], timeout: httpx.Timeout
                 ) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {**headers, **JSON_HEADERS}
        self._extensions = {"timeout": timeout.as_dict()}
        self._urls: dict[str, httpx.URL] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[httpx.HTTPTransport] = []

    def post(self, path: str, content: bytes, headers: dict[str, str] | None = None
             ) -> httpx.Response:
        """POST a JSON body; the response is read whole. httpx.HTTPError as `Client.post`."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self._base + path)
        request = httpx.Request("POST", url, content=content,
                                headers={**self._headers, **headers} if headers
                                else self._headers, extensions=self._extensions)
        response = self._transport().handle_request(request)
        response.request = request
        try:
            response.read()
        finally:
            response.close()  # the connection back to this thread's pool
        return response

    def _transport(self) -> httpx.HTTPTransport:
        transport: httpx.HTTPTransport | None = getattr(self._local, "transport", None)
        if transport is None:
            transport = self._local.transport = httpx.HTTPTransport(
                verify=ssl_context(),
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
            with self._lock:
                self._all.append(transport)
        return transport

    def close(self) -> None:
        with self._lock:
            transports, self._all = self._all, []
        for transport in transports:
            transport.close()
