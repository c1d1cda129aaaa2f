"""Floor 4, the engines: one interface (`EngineProtocol`), its implementations and the engine
kinds behind them, all in the registry (fleetgen/engine/kinds.py); `resolve` picks a protocol
by name or by asking the server. Imports only the floors below it (the root, settings,
queue, run state, records)."""

from __future__ import annotations

import logging
from typing import Any

from fleetgen.engine.api import (
    PLAIN,
    Engine,
    EngineProtocol,
    GenerateOptions,
    LengthRule,
    ServerLimits,
)
from fleetgen.engine.detect import detect
from fleetgen.engine.kinds import DEFAULT_PROTOCOL, protocol, protocol_names
from fleetgen.engine.urls import check_url, engine_urls, one_engine_url
from fleetgen.errors import ConfigError, EngineError
from fleetgen.settings.envvars import ENGINE_PROTOCOL

__all__ = ["DEFAULT_PROTOCOL", "PLAIN", "PROTOCOLS", "Engine", "EngineProtocol",
           "GenerateOptions", "LengthRule", "ServerLimits", "check_url", "engine_urls",
           "one_engine_url", "protocol", "protocol_names", "resolve"]

log = logging.getLogger("fleetgen.engine")


def __getattr__(name: str) -> Any:
    # PROTOCOLS is the registry's, filled at first use: importing this package must not import
    # a plug-in (FLEETGEN_ENGINE_KINDS) that itself imports this package.
    if name == "PROTOCOLS":
        from fleetgen.engine.kinds import REGISTRY

        return REGISTRY.protocols()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve(name: str | None, base_url: str | None, api_key: str | None = None,
            ) -> EngineProtocol:
    """The protocol named, else the one the server at `base_url` speaks (logged with the
    evidence), else SGLang's native protocol. ConfigError for a server that speaks none,
    or for a name the server contradicts."""
    if name:
        chosen = protocol(name)
        if base_url:
            _confirm(chosen, base_url, api_key)
        return chosen
    if not base_url:
        return protocol(DEFAULT_PROTOCOL)
    found = detect(base_url, api_key)
    log.info("engine %s: protocol %s (%s)", base_url, found.protocol, found.evidence)
    return protocol(found.protocol)


def _confirm(chosen: EngineProtocol, base_url: str, api_key: str | None) -> None:
    """A protocol only its own kind serves (SGLang's native /generate) needs a server of that
    kind: anything else answers every request with a 404, a run of failures instead of one
    line at start-up."""
    if getattr(chosen, "open_to_all", False):
        return
    try:
        found = detect(base_url, api_key)
    except (ConfigError, EngineError):
        return  # not reachable yet, or not saying: the caller's own reads report that
    if found.protocol != chosen.name:
        spoken = getattr(chosen, "description", f"the {chosen.name} protocol")
        raise ConfigError(f"{base_url} does not speak {spoken} ({found.evidence}); use "
                          f"{ENGINE_PROTOCOL.name}={found.protocol} (or --engine-protocol "
                          f"{found.protocol})")
