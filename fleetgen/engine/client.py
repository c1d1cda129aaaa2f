"""The part every engine client shares (as httpx's `BaseClient` holds what its clients share):
the connections, their timeouts and pool limits, the readiness probe, and one POST whose
transport errors, refusals and bad JSON all come out as fleetgen.errors."""

from __future__ import annotations

import abc
from typing import Any

import httpx
import orjson

from fleetgen import errors
from fleetgen.engine.api import PLAIN, GenerateOptions, LengthRule
from fleetgen.engine.decision import from_transport, not_json
from fleetgen.engine.health import Prober
from fleetgen.engine.http import ThreadPosts, auth_headers, response_json, ssl_context
from fleetgen.records.outcomes import Generation

# A readiness probe answers at once (/ready); past this the server counts as slow, not gone.
PROBE_TIMEOUT_S = 2.0
# A server that does not accept a connection in this long is not there: connecting never
# waits as long as a generation may.
CONNECT_TIMEOUT_S = 5.0
# Connections beyond the pool's threads: the probes and /metrics reads of the shared client.
SPARE_CONNECTIONS = 4


class EngineClient(abc.ABC):
    """Talks to one server for a worker's lifetime. Raises only fleetgen.errors.EngineError.

    Generations go through a transport of their own per pool thread (`ThreadPosts`); probes
    and the rest through the shared `httpx.Client`. A subclass says only what is its engine's:
    its length rule, its request and answer (`generate`), and what its refusals mean
    (`refusal`)."""

    rule: LengthRule

    def __init__(self, base_url: str, *, timeout_s: float, concurrency: int,
                 api_key: str | None = None) -> None:
        limits = httpx.Limits(max_connections=concurrency + SPARE_CONNECTIONS,
                              max_keepalive_connections=concurrency + SPARE_CONNECTIONS)
        timeout = httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S, pool=timeout_s)
        self.base_url = base_url.rstrip("/")
        headers = auth_headers(api_key)
        self._http = httpx.Client(base_url=self.base_url, headers=headers, limits=limits,
                                  timeout=timeout, verify=ssl_context())
        self._probe = Prober(self._http, PROBE_TIMEOUT_S)
        self._posts = ThreadPosts(self.base_url, headers=headers, timeout=timeout)

    @abc.abstractmethod
    def generate(self, input_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any], rid: str,
                 options: GenerateOptions = PLAIN) -> Generation: ...

    @abc.abstractmethod
    def refusal(self, response: httpx.Response, body: dict[str, Any]) -> errors.EngineError:
        """The error a non-200 answer to `body` means on this engine."""

    def healthy(self) -> bool:
        """Ready or slow, never a generation probe: /ready (SGLang; 0.5.23's /health submits a
        generation, >= 1 s and up to 20 s when busy), /health where that is instant (vLLM,
        llama.cpp)."""
        return self._probe().up

    def close(self) -> None:
        self._posts.close()
        self._http.close()

    def _post(self, path: str, body: dict[str, Any],
              headers: dict[str, str] | None = None) -> Any:
        """POST `body` and return the answer's JSON."""
        try:
            # orjson both ways: httpx's `json=` and `.json()` are the stdlib's, ~5x slower
            # on a body of token ids.
            response = self._posts.post(path, orjson.dumps(body), headers)
        except httpx.HTTPError as exc:
            raise from_transport(exc) from exc
        if response.status_code != 200:
            raise self.refusal(response, body)
        try:
            return response_json(response)
        except ValueError as exc:
            raise not_json("engine", exc) from exc
