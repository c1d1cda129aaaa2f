"""The registry of engine kinds and protocols: what fleetgen knows of each engine (SGLang, vLLM,
llama.cpp, or one a plug-in adds) is declared once, as an `EngineKind`, and every command, the
producer and the workers ask the registry instead of testing an engine's name.

A protocol (`EngineProtocol`: SGLang's native /generate, OpenAI's /v1/completions) is how
fleetgen talks to a server; a kind is what answers behind it (its length rule, its limits and
slots, its queue gauges, its chat-template check, its readiness path, its acceptance). One kind
is spoken to in one protocol by default (`protocol`) and may be in others (SGLang's /v1).

Kinds outside this package are loaded from `FLEETGEN_ENGINE_KINDS` (comma-separated
`module` or `module:object`) at the registry's first use, in every process (the workers
inherit the variable), so a plug-in is one module: docs/engines.md "Adding an engine kind".
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetgen.engine.api import EngineProtocol, Gauges, LengthRule, ServerLimits
from fleetgen.errors import ConfigError
from fleetgen.settings.envvars import ENGINE_KINDS, ENGINE_PROTOCOL

if TYPE_CHECKING:  # only for the hooks' types: those modules use the registry at call time
    import httpx

    from fleetgen.engine.api import Check, Difference, Engine, ServerRendering

# The protocol when no server is read and none is named (--context-length alone).
DEFAULT_PROTOCOL = "sglang"
# Reads a server's limits: (base_url, api_key, timeout_s).
LimitsReader = Callable[[str, "str | None", float], ServerLimits]
# Renders chat messages through the server's own chat path: (http, limits, messages, kwargs).
ChatRender = Callable[["httpx.Client", ServerLimits, list[dict[str, Any]], dict[str, Any]],
                      "ServerRendering"]
# Doctor's probes of a connected client: (client, needs), `needs` the run's flags that read
# what only some servers return (--token-ids, --stop).
ClientChecks = Callable[["Engine", tuple[str, ...]], list["Check"]]
# Doctor's checks by URL once the client is closed: (url, api_key, timeout_s).
ServerChecks = Callable[[str, "str | None", float], list["Check"]]


def slots_plus_one(limits: ServerLimits) -> int | None:
    """K + 1 threads for K running slots, so one request always waits in the server's queue
    while a thread does its bookkeeping (96 % -> 99.7 % slot utilization for short requests,
    docs/performance.md); None behind a router (its servers' slots are shared by every worker
    that points at it, and how many do is not the router's to say) or when no slots are
    reported."""
    slots = limits.max_running_requests
    if limits.servers_behind:
        return None
    return slots + 1 if slots else None


def _nothing(*_: Any) -> None:
    return None


def _no_checks(*_: Any) -> list[Check]:
    return []


@dataclass(frozen=True)
class EngineKind:
    """One engine as fleetgen knows it. Only `name`, `protocol`, `rule` and `read_limits` are
    required; every other hook has a neutral default (no gauges, no template check, ...)."""

    name: str  # as `ServerLimits.engine` says it
    protocol: str  # the protocol it is spoken to in when detected (a registered protocol)
    rule: LengthRule  # its length checks (the budget, the one-shot correction)
    read_limits: LimitsReader  # its context, slots, reserve ... (`ServerLimits`)
    # Detection: evidence that a server is of this kind (for the log), or None. Tried in
    # `detect_order`: a catch-all (anything answering /v1/models) must come last.
    identify: Callable[[httpx.Client], str | None] = _nothing
    detect_order: int = 50
    # Worker threads for a server of these limits, None when it does not say (then paced).
    pool_size: Callable[[ServerLimits], int | None] = slots_plus_one
    gauges: Gauges | None = None  # its queue on /metrics (the pacer), None: not readable
    # Readiness: the instant paths it answers, probed in registry order, 404 -> the next.
    ready_paths: tuple[str, ...] = ("/health",)
    # doctor's chat-template check; None: the kind renders no chats (not compared).
    render_chat: ChatRender | None = None
    template_hint: Callable[[Difference], str | None] = _nothing  # a known cause of a mismatch
    reasoning_note: Callable[[ServerLimits], str | None] = _nothing  # doctor's `note:` line
    client_checks: ClientChecks = _no_checks
    server_checks: ServerChecks = _no_checks
    # Acceptance: its speculative algorithm (url, api_key, timeout_s), None: it speculates not.
    speculation: Callable[[str, str | None, float], str | None] = _nothing
    # Why a JSON schema's grammar cannot wait for `</think>` here (url, limits, protocol name),
    # naming the fix; None: it can, or the kind does not say.
    grammar_cannot_wait: Callable[[str, ServerLimits, str], str | None] = _nothing


class Registry:
    """The kinds and protocols known to this process, loaded once (builtins, then
    FLEETGEN_ENGINE_KINDS) at first use."""

    def __init__(self) -> None:
        self._kinds: dict[str, EngineKind] = {}
        self._protocols: dict[str, EngineProtocol] = {}
        self._lock = threading.RLock()  # pool threads may look up at the same first moment
        self._loaded = False

    def add_kind(self, kind: EngineKind) -> None:
        with self._lock:
            self._kinds[kind.name] = kind

    def add_protocol(self, proto: EngineProtocol) -> None:
        with self._lock:
            self._protocols[proto.name] = proto

    def kinds(self) -> dict[str, EngineKind]:
        self._load()
        return dict(self._kinds)

    def protocols(self) -> dict[str, EngineProtocol]:
        self._load()
        return dict(self._protocols)

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # before the imports: a plug-in may look kinds up as it loads
            # The built-in kinds are the first plug-in, loaded as any other is: by name, so
            # that this module, which their modules import, imports none of them.
            for spec in [BUILTIN, *_specs(ENGINE_KINDS.value())]:
                _load_plugin(self, spec)


BUILTIN = "fleetgen.engine.builtin:register"


def _specs(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def _load_plugin(registry: Registry, spec: str) -> None:
    """`module` registers at import; `module:object` names a kind, a protocol, a sequence of
    them, or a callable taking the registry."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        found = getattr(module, attr) if attr else None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{ENGINE_KINDS.name}: cannot load {spec!r} ({exc}); it names "
                          "`module` or `module:object`, importable in every process") from exc
    if found is not None:
        _add(registry, found)


def _add(registry: Registry, found: Any) -> None:
    if isinstance(found, EngineKind):
        registry.add_kind(found)
    elif hasattr(found, "connect") and hasattr(found, "read_limits"):
        registry.add_protocol(found)
    elif callable(found):
        found(registry)
    elif isinstance(found, Iterable):
        for item in found:
            _add(registry, item)
    else:
        raise ConfigError(f"{ENGINE_KINDS.name}: {found!r} is not a kind, a protocol or a "
                          "callable")


REGISTRY = Registry()


def register(*items: EngineKind | EngineProtocol) -> None:
    """Adds kinds and protocols to this process's registry (a plug-in's module calls this)."""
    for item in items:
        _add(REGISTRY, item)


def kind_of(name: str) -> EngineKind | None:
    """The kind `ServerLimits.engine` names, None for one no module declared."""
    return REGISTRY.kinds().get(name)


def kinds_to_detect() -> list[EngineKind]:
    return sorted(REGISTRY.kinds().values(), key=lambda k: k.detect_order)


def protocol_names() -> tuple[str, ...]:
    """The choices of every `--engine-protocol` and of FLEETGEN_ENGINE_PROTOCOL."""
    return tuple(REGISTRY.protocols())


def protocol(name: str = DEFAULT_PROTOCOL) -> EngineProtocol:
    try:
        return REGISTRY.protocols()[name]
    except KeyError:
        known = ", ".join(sorted(protocol_names()))
        raise ConfigError(f"unknown engine protocol {name!r} (known: {known}); set "
                          f"{ENGINE_PROTOCOL.name} or --engine-protocol to one of them") from None


def ready_paths() -> tuple[str, ...]:
    """Every kind's readiness paths, in registry order without repeats: the builtins' are
    SGLang's `/ready`, its router's `/readiness`, then `/health`."""
    paths: dict[str, None] = {}
    for kind in REGISTRY.kinds().values():
        paths.update(dict.fromkeys(kind.ready_paths))
    return tuple(paths)


def pool_size(limits: ServerLimits) -> int | None:
    """The kind's own sizing; an undeclared kind's slots + 1 where it reports them."""
    kind = kind_of(limits.engine)
    return (kind.pool_size if kind else slots_plus_one)(limits)


def gauges_of(engine: str) -> Gauges | None:
    """The queue gauges of a kind, None for one that has none or that no module declared."""
    kind = kind_of(engine)
    return kind.gauges if kind else None
