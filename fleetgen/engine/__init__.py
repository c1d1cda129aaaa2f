"""Floor 2, the engines: one interface (`EngineProtocol`) and its implementations; `protocol(name)`
picks one by name. Imports only the base."""

from __future__ import annotations

from fleetgen.base.errors import ConfigError
from fleetgen.engine.api import Engine, EngineProtocol, LengthRule, ServerLimits
from fleetgen.engine.sglang import PROTOCOL as SGLANG

PROTOCOLS: dict[str, EngineProtocol] = {SGLANG.name: SGLANG}
DEFAULT_PROTOCOL = SGLANG.name

__all__ = ["PROTOCOLS", "Engine", "EngineProtocol", "LengthRule", "ServerLimits", "protocol"]


def protocol(name: str = DEFAULT_PROTOCOL) -> EngineProtocol:
    try:
        return PROTOCOLS[name]
    except KeyError:
        known = ", ".join(sorted(PROTOCOLS))
        raise ConfigError(f"unknown engine protocol {name!r} (known: {known})") from None
