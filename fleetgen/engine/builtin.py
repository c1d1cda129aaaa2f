"""The engine kinds and protocols fleetgen ships, declared for the registry
(fleetgen/engine/kinds.py): each kind's hooks point at the code that knows that engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetgen.engine import openai, preflight, sglang, speculation, template
from fleetgen.engine.kinds import EngineKind
from fleetgen.engine.load import Gauges

if TYPE_CHECKING:
    from fleetgen.engine.api import Engine
    from fleetgen.engine.kinds import Registry
    from fleetgen.engine.preflight import Check

# The queue gauges and the generated-tokens counter on /metrics, from the engines' sources
# (fleetgen/engine/load.py).
SGLANG_GAUGES = Gauges("sglang:num_running_reqs", "sglang:num_queue_reqs",
                       "sglang:generation_tokens_total")
VLLM_GAUGES = Gauges("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:generation_tokens_total")
LLAMA_CPP_GAUGES = Gauges("llamacpp:requests_processing", "llamacpp:requests_deferred",
                          "llamacpp:tokens_predicted_total")


def _verbose(client: Engine, needs: tuple[str, ...]) -> list[Check]:
    return [preflight.keeps_verbose(client, needs)]


def _acceptance(url: str, api_key: str | None, timeout_s: float) -> list[Check]:
    check = preflight.per_request_acceptance(url, api_key, timeout_s)
    return [check] if check else []


SGLANG = EngineKind(
    name=sglang.RULE.name, protocol=sglang.PROTOCOL.name, rule=sglang.RULE,
    read_limits=lambda url, key, t: sglang.read_limits(url, api_key=key, timeout_s=t),
    identify=sglang.identify, detect_order=10, gauges=SGLANG_GAUGES,
    # 0.5.23's /health submits a generation (fleetgen/engine/health.py); its router's
    # instant path is /readiness.
    ready_paths=("/ready", "/readiness"),
    render_chat=template.render_sglang, reasoning_note=template.sglang_reasoning,
    speculation=speculation.sglang_algorithm, grammar_cannot_wait=sglang.grammar_cannot_wait)

LLAMA_CPP = EngineKind(
    name=openai.LLAMA_CPP, protocol=openai.PROTOCOL.name, rule=openai.RULES[openai.LLAMA_CPP],
    read_limits=openai.llama_cpp_limits, identify=openai.identify_llama_cpp, detect_order=20,
    gauges=LLAMA_CPP_GAUGES, render_chat=template.render_llama_cpp,
    template_hint=template.llama_cpp_hint, client_checks=_verbose)

# The catch-all of the OpenAI protocol: any server answering /v1/models, so detected last.
VLLM = EngineKind(
    name=openai.VLLM, protocol=openai.PROTOCOL.name, rule=openai.RULES[openai.VLLM],
    read_limits=openai.vllm_limits, identify=openai.identify_openai, detect_order=90,
    gauges=VLLM_GAUGES, render_chat=template.render_vllm,
    reasoning_note=template.vllm_reasoning, server_checks=_acceptance,
    speculation=speculation.vllm_algorithm)


def register(registry: Registry) -> None:
    registry.add_protocol(sglang.PROTOCOL)
    registry.add_protocol(openai.PROTOCOL)
    for kind in (SGLANG, LLAMA_CPP, VLLM):
        registry.add_kind(kind)
