"""Which kind of engine a server is, and so which protocol it speaks, from what it answers (and
the evidence, for the log): each registered kind's `identify`, in its `detect_order`."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from fleetgen.engine.http import server_client
from fleetgen.engine.kinds import EngineKind, kinds_to_detect
from fleetgen.errors import ConfigError, EngineUnreachable


@dataclass(frozen=True)
class Detected:
    protocol: str  # the kind's protocol: "sglang", "openai", or a plug-in's
    engine: str  # the kind: "sglang", "vllm", "llama.cpp", or a plug-in's
    evidence: str


def detect(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> Detected:
    """The first kind that recognises the server. The builtins: SGLang (and its router) answer
    /server_info or /get_server_info, llama.cpp /props, vLLM and others /v1/models."""
    try:
        with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
            found = identify_kind(http)
    except httpx.ConnectError as exc:
        raise EngineUnreachable(f"cannot connect to {base_url}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise EngineUnreachable(f"{base_url} did not answer: {type(exc).__name__}") from exc
    if found is None:
        raise ConfigError(f"{base_url} answers neither SGLang's native protocol (/server_info) "
                          "nor the OpenAI protocol (/v1/models), nor any registered engine "
                          "kind's; is it an inference server?")
    kind, evidence = found
    return Detected(kind.protocol, kind.name, evidence)


def identify_kind(http: httpx.Client, prefer: str | None = None,
                  ) -> tuple[EngineKind, str] | None:
    """The kind of the server `http` points at and the evidence, or None; the kinds spoken to
    in protocol `prefer` are asked first (a client of that protocol has its own kinds'
    endpoints in mind). Transport errors propagate."""
    for kind in sorted(kinds_to_detect(), key=lambda k: k.protocol != prefer):
        evidence = kind.identify(http)
        if evidence is not None:
            return kind, evidence
    return None
