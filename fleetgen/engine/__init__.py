"""Floor 2, the engines: one interface (`EngineProtocol`) and its implementations; `resolve`
picks one by name or by asking the server. Imports only the base."""

from __future__ import annotations

import logging

from fleetgen.base.envvars import ENGINE_PROTOCOL
from fleetgen.base.errors import ConfigError, EngineError
from fleetgen.engine.api import (
    PLAIN,
    Engine,
    EngineProtocol,
    GenerateOptions,
    LengthRule,
    ServerLimits,
)
from fleetgen.engine.detect import detect
from fleetgen.engine.openai import PROTOCOL as OPENAI
from fleetgen.engine.sglang import PROTOCOL as SGLANG
from fleetgen.engine.urls import check_url, engine_urls, one_engine_url

PROTOCOLS: dict[str, EngineProtocol] = {SGLANG.name: SGLANG, OPENAI.name: OPENAI}
DEFAULT_PROTOCOL = SGLANG.name

__all__ = ["PLAIN", "PROTOCOLS", "Engine", "EngineProtocol", "GenerateOptions", "LengthRule",
           "ServerLimits", "check_url", "engine_urls", "one_engine_url", "protocol",
           "resolve"]

log = logging.getLogger("fleetgen.engine")


def protocol(name: str = DEFAULT_PROTOCOL) -> EngineProtocol:
    try:
        return PROTOCOLS[name]
    except KeyError:
        known = ", ".join(sorted(PROTOCOLS))
        raise ConfigError(f"unknown engine protocol {name!r} (known: {known}); set "
                          f"{ENGINE_PROTOCOL.name} or --engine-protocol to one of them") from None


def resolve(name: str | None, base_url: str | None, api_key: str | None = None,
            ) -> EngineProtocol:
    """The protocol named, else the one the server at `base_url` speaks (logged with the
    evidence), else SGLang's native protocol. ConfigError for a server that speaks neither,
    or for a name the server contradicts."""
    if name:
        chosen = protocol(name)
        if base_url:
            _confirm(chosen, base_url, api_key)
        return chosen
    if not base_url:
        return protocol()
    found = detect(base_url, api_key)
    log.info("engine %s: protocol %s (%s)", base_url, found.protocol, found.evidence)
    return protocol(found.protocol)


def _confirm(chosen: EngineProtocol, base_url: str, api_key: str | None) -> None:
    """SGLang's native protocol needs an SGLang server (or router): anything else answers
    every /generate with a 404, a run of failures instead of one line at start-up."""
    if chosen.name != SGLANG.name:
        return
    try:
        found = detect(base_url, api_key)
    except (ConfigError, EngineError):
        return  # not reachable yet, or not saying: the caller's own reads report that
    if found.protocol != SGLANG.name:
        raise ConfigError(f"{base_url} does not speak SGLang's native protocol ({found.evidence})"
                          f"; use {ENGINE_PROTOCOL.name}=openai (or --engine-protocol openai)")
