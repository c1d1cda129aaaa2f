"""`--flavor vllm`'s OpenAI answers in vLLM 0.32.0's shapes, as the real server answered the
same probes (tests/real_engines/test_vllm.py diffs them): completions and chat with every field
vLLM writes (`return_token_ids` ids, `prompt_tokens_details`), and its chat endpoint."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

from fleetgen.simulator.chat import _split_reasoning, parse_chat, prompt_ids
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.openai_api import render_completions, usage_of
from fleetgen.simulator.request import GenerationRequest, InFlight, ServedItem, vllm_limit
from fleetgen.simulator.spec import steps_for, vllm_request_metrics

# vLLM 0.32.0's `system_fingerprint` (`vllm-<version>-<build>`), as the real server wrote it.
FINGERPRINT = "vllm-0.32.0-38308f13"
# Fields vLLM writes as null unless a feature this simulator lacks fills them.
_RESPONSE_NULLS = {"service_tier": None, "kv_transfer_params": None,
                   "ec_transfer_params": None, "metrics": None}


def _usage(outcomes: list[ServedItem], created_cache_tokens: int | None) -> dict[str, Any]:
    """With `--enable-prompt-tokens-details` (the tests' server): the cached prompt tokens;
    the chat path counts `created_cache_tokens`, completions leave it null."""
    usage: dict[str, Any] = usage_of(outcomes)
    cached = sum(o.cached_tokens for o in outcomes)
    usage["prompt_tokens_details"] = {"cached_tokens": cached,
                                      "created_cache_tokens": created_cache_tokens,
                                      "multimodal_tokens": None}
    usage["completion_tokens_details"] = None
    return usage


def _metrics(outcomes: list[ServedItem], config: SimConfig) -> dict[str, Any] | None:
    """`metrics` (entrypoints/generate/base/protocol.py `PerRequestMetrics`): null unless the
    server runs with --per-request-spec-decode-metrics (the timing fields need
    --enable-per-request-metrics, which the simulator lacks), and for more than one sequence
    (completion/serving.py suppresses it: the figures are of one stream)."""
    if config.speculative_algorithm is None or config.per_request_spec_decode_metrics == "none" \
            or len(outcomes) != 1:
        return None
    outcome = outcomes[0]
    tokens = outcome.completion.completion_tokens
    steps = steps_for(config, outcome.item.key, outcome.item.prompt, tokens)
    return {"time_to_first_token_ms": None, "generation_time_ms": None, "queue_time_ms": None,
            "mean_itl_ms": None, "tokens_per_second": None,
            "speculative_decoding": {**vllm_request_metrics(steps),
                                     "per_step_accepted": None, "per_step_drafted": None}}


def _short_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def render_completions_vllm(job: GenerationRequest, outcomes: list[ServedItem],
                            config: SimConfig) -> dict[str, Any]:
    """`CompletionResponse`: every choice has `token_ids` and `prompt_token_ids` (null unless
    `return_token_ids`), `prompt_logprobs` and `routed_experts`."""
    body = render_completions(job, outcomes, config)
    for choice, outcome in zip(body["choices"], outcomes, strict=True):
        prompt = outcome.item.prompt
        asked = job.extras.token_ids
        choice["token_ids"] = outcome.completion.output_ids if asked else None
        choice["prompt_logprobs"] = None
        choice["prompt_token_ids"] = list(prompt) if asked and isinstance(prompt, list) \
            else None
        choice["routed_experts"] = None
    body["id"] = _short_id("cmpl")
    body.update(_RESPONSE_NULLS, system_fingerprint=FINGERPRINT,
                usage=_usage(outcomes, None), metrics=_metrics(outcomes, config))
    return body


def parse_chat_vllm(body: Any, config: SimConfig, in_flight: InFlight) -> GenerationRequest:
    """The chat path's rendering and rules, with vLLM's budget and `return_token_ids`: no
    `max_tokens` is the room the prompt leaves (ChatCompletionRequest's default None, then
    `get_max_tokens`), and a rendered prompt is tokenized to at most max_model_len + 1 ids
    (`TokenizeParams.get_encode_kwargs`), so a long one is refused as "at least" one over."""
    ids = None
    if isinstance(body, dict):
        context = config.context_length
        ids = prompt_ids(config, body)  # rendered once: parse_chat takes these ids
        wanted = body.get("max_completion_tokens") or body.get("max_tokens")
        if len(ids) > context:
            vllm_limit(context + 1, wanted, config)  # raises
        if wanted is None:
            body = {**body, "max_tokens": max(0, context - len(ids))}
    job = parse_chat(body, config, in_flight, ids)
    return replace(job, extras=replace(job.extras,
                                       token_ids=body.get("return_token_ids") is True))


def render_chat_vllm(job: GenerationRequest, outcomes: list[ServedItem],
                     config: SimConfig) -> dict[str, Any]:
    """`ChatCompletionResponse`: the message's `reasoning` (its parser's split, else null),
    the choice's `token_ids`, the response's `prompt_token_ids`, both null unless
    `return_token_ids`."""
    asked = job.extras.token_ids
    choices = []
    for index, outcome in enumerate(outcomes):
        reasoning, content = _split_reasoning(outcome, config)
        finish = outcome.completion.finish_reason
        matched = finish.get("matched")
        choices.append({
            "index": index,
            "message": {"role": "assistant", "content": content, "refusal": None,
                        "annotations": None, "audio": None, "function_call": None,
                        "reasoning": reasoning},
            "logprobs": None,
            "finish_reason": finish["type"],
            "stop_reason": matched if isinstance(matched, str) else None,
            "token_ids": outcome.completion.output_ids if asked else None,
            "routed_experts": None,
        })
    prompt = outcomes[0].item.prompt if outcomes else []
    return {
        "id": _short_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": config.model_name,
        "choices": choices,
        **_RESPONSE_NULLS,
        "metrics": _metrics(outcomes, config),
        "system_fingerprint": FINGERPRINT,
        "usage": _usage(outcomes, 0),
        "prompt_logprobs": None,
        "prompt_token_ids": list(prompt) if asked and isinstance(prompt, list) else None,
        "prompt_text": None,
    }
