"""Which protocol a server speaks, from what it answers (and the evidence, for the log)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from fleetgen.base.errors import ConfigError, EngineUnreachable
from fleetgen.engine.http import optional_json, server_client


@dataclass(frozen=True)
class Detected:
    protocol: str  # "sglang" | "openai"
    engine: str  # "sglang", "sglang-router", "vllm", "llama.cpp", "openai"
    evidence: str


def detect(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> Detected:
    """SGLang (and its router) answer /server_info or /get_server_info: native /generate.
    llama.cpp answers /props, vLLM and others /v1/models: /v1/completions."""
    try:
        with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
            return _detect(http, base_url)
    except httpx.ConnectError as exc:
        raise EngineUnreachable(f"cannot connect to {base_url}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise EngineUnreachable(f"{base_url} did not answer: {type(exc).__name__}") from exc


def _detect(http: httpx.Client, base_url: str) -> Detected:
    for path in ("/server_info", "/get_server_info"):
        info = optional_json(http, path)
        if isinstance(info, dict) and info.get("router_manager"):
            return Detected("sglang", "sglang-router", f"{path} describes an SGLang router")
        if isinstance(info, dict):  # neither vLLM nor llama.cpp has this endpoint
            return Detected("sglang", "sglang",
                            f"{path} answers (SGLang {info.get('version', 'of unknown version')})")
    props = optional_json(http, "/props")
    if isinstance(props, dict) and "default_generation_settings" in props:
        return Detected("openai", "llama.cpp", "/props answers (llama.cpp's server)")
    models = optional_json(http, "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        owner = data[0].get("owned_by", "?")
        return Detected("openai", str(owner), f"/v1/models answers, owned_by {owner!r}, "
                                              "no SGLang server info")
    raise ConfigError(f"{base_url} answers neither SGLang's native protocol (/server_info) nor "
                      "the OpenAI protocol (/v1/models); is it an inference server?")
