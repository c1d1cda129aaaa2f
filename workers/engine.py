"""The engine client: one long-lived httpx.Client per worker process, SGLang's native /generate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from workers import errors


@dataclass(frozen=True)
class Generation:
    text: str
    finish_reason: str  # stop | length | abort
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float


@dataclass(frozen=True)
class ServerLimits:
    context_length: int
    max_total_tokens: int | None
    max_running_requests: int | None
    model: str | None


class Engine(Protocol):
    def generate(self, input_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any], rid: str) -> Generation: ...

    def healthy(self) -> bool: ...


class EngineClient:
    """Talks to one SGLang server (or router). Raises only workers.errors.EngineError."""

    def __init__(self, base_url: str, *, timeout_s: float, concurrency: int,
                 api_key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Pool sized to the worker's concurrency: every thread holds one request at a time.
        limits = httpx.Limits(max_connections=concurrency + 4,
                              max_keepalive_connections=concurrency + 4)
        timeout = httpx.Timeout(timeout_s, connect=5.0, pool=timeout_s)
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, limits=limits,
                                  timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def generate(self, input_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any], rid: str) -> Generation:
        body = {
            "input_ids": input_ids,
            "sampling_params": sampling_params(sampling, max_new_tokens),
            "rid": rid,
            "stream": False,
        }
        data = self._post("/generate", body)
        return parse_generation(data)

    def healthy(self) -> bool:
        try:
            return self._http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = self._http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise errors.from_transport(exc) from exc
        if response.status_code != 200:
            raise errors.from_response(response)
        try:
            return response.json()
        except ValueError as exc:
            raise errors.RetryableError(f"engine sent invalid JSON: {exc}", 200) from exc


def sampling_params(sampling: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """Our sampling options in SGLang's names. `seed` is SGLang's `sampling_seed`."""
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for key, value in sampling.items():
        params["sampling_seed" if key == "seed" else key] = value
    return params


def parse_generation(data: Any) -> Generation:
    if isinstance(data, list):  # a batch of one
        data = data[0]
    try:
        meta = data["meta_info"]
        reason = meta.get("finish_reason") or {}
        return Generation(
            text=data["text"],
            finish_reason=str(reason.get("type", "unknown")),
            prompt_tokens=int(meta["prompt_tokens"]),
            completion_tokens=int(meta["completion_tokens"]),
            cached_tokens=int(meta.get("cached_tokens", 0)),
            latency_s=float(meta.get("e2e_latency", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise errors.RetryableError(f"engine response lacks {exc}", 200) from exc


def read_limits(base_url: str, *, api_key: str | None = None,
                timeout_s: float = 10.0) -> ServerLimits:
    """Context length from /v1/models (`max_model_len`), cross-checked with /get_server_info,
    which also gives the KV capacity (max_total_num_tokens) where the server has it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as http:
        try:
            models = http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise errors.from_transport(exc) from exc
        if models.status_code != 200:
            raise errors.from_response(models)
        entry = (models.json().get("data") or [{}])[0]
        context = entry.get("max_model_len")
        info = _server_info(http)
    if context is None:
        context = info.get("context_length")
    if not isinstance(context, int) or context <= 0:
        raise errors.PermanentError(f"{base_url} reports no context length (/v1/models has no "
                                    "max_model_len); pass --context-length")
    if isinstance(info.get("context_length"), int) and info["context_length"] < context:
        context = info["context_length"]
    return ServerLimits(context_length=context,
                        max_total_tokens=_int_or_none(info.get("max_total_num_tokens")),
                        max_running_requests=_int_or_none(info.get("max_running_requests")),
                        model=entry.get("id"))


def _server_info(http: httpx.Client) -> dict[str, Any]:
    for path in ("/get_server_info", "/server_info"):
        try:
            response = http.get(path)
        except httpx.HTTPError:
            return {}
        if response.status_code == 200:
            body = response.json()
            return body if isinstance(body, dict) else {}
    return {}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None
