"""OpenAI's /v1/completions as SGLang and vLLM serve it: the request body, the completion and
its logprobs, usage, and the error bodies of each."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from itertools import accumulate
from typing import Any

from fleetgen.simulator import answers
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.request import (
    DEFAULT_MAX_TOKENS,
    RANGE_RULES,
    ApiError,
    Extras,
    GenerationRequest,
    InFlight,
    ServedItem,
    bad_request,
    build_job,
    http_exception_body,
    parse_sampling,
    refuse_duplicates,
    refuse_stream,
    token_ids,
)


def openai_error_body(error: ApiError) -> dict[str, Any]:
    if error.status < 500:
        return {
            "object": "error", "message": error.message, "type": "BadRequestError",
            "param": None, "code": error.status,
        }
    return http_exception_body(error)


def vllm_error_body(error: ApiError) -> dict[str, Any]:
    """vLLM's `ErrorResponse` (entrypoints/serve/engine/protocol.py): {"error": ErrorInfo}."""
    kind = "BadRequestError" if error.status < 500 else "InternalServerError"
    return {"error": {"message": error.message, "type": kind, "param": error.param,
                      "code": error.status}}


_OPENAI_TO_SAMPLING = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
                       "seed": "sampling_seed"}
_OPENAI_SAMPLING_KEYS = (
    *(name for name, *_ in RANGE_RULES), "n", "ignore_eos", "skip_special_tokens", "stop",
    *_OPENAI_TO_SAMPLING,
)


def parse_completions(body: Any, config: SimConfig, in_flight: InFlight, *,
                      require_reasoning: bool = False) -> GenerationRequest:
    """Turn an OpenAI completions body (prompt as text or token ids) into checked items.
    `require_reasoning`: the chat path's, from the thinking mode (chat.py)."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    refuse_stream(body)
    prompts = _openai_prompts(body.get("prompt"))
    raw = {
        _OPENAI_TO_SAMPLING.get(key, key): body[key]
        for key in _OPENAI_SAMPLING_KEYS
        if body.get(key) is not None
    }
    raw.setdefault("max_new_tokens", DEFAULT_MAX_TOKENS)
    schema = _vllm_schema(body) if config.flavor == "vllm" else body.get("json_schema")
    if schema is not None:
        raw["json_schema"] = schema
    if config.flavor != "vllm" and body.get("regex") is not None:  # SGLang's extension
        raw["regex"] = body["regex"]
    extras = replace(_openai_extras(body, config), require_reasoning=require_reasoning)
    sampling = parse_sampling(raw)
    rid = body.get("rid")
    base = rid if isinstance(rid, str) else uuid.uuid4().hex
    rids = [base] if len(prompts) == 1 else [f"{base}-p{i}" for i in range(len(prompts))]
    rids = [r for r in rids for _ in range(sampling.n)]
    refuse_duplicates(rids, in_flight)
    return build_job(prompts, [sampling] * len(prompts), rids, True, config, extras)


# vLLM 0.33 `ModelConfig.max_logprobs` default: `SamplingParams._validate_logprobs` refuses more.
VLLM_MAX_LOGPROBS = 20


def _openai_extras(body: dict[str, Any], config: SimConfig) -> Extras:
    """`logprobs` (K), `return_token_ids`, and vLLM's `return_tokens_as_token_ids`, with
    vLLM's checks (`CompletionRequest.check_logprobs`, `SamplingParams._validate_logprobs`)."""
    top = body.get("logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int):
            raise bad_request("`logprobs` must be an integer.")
        if top < 0:
            raise bad_request("`logprobs` must be a positive value or -1." if top != -1 else
                              "The simulator does not return the whole vocabulary "
                              "(logprobs -1).")
        if config.flavor == "vllm" and top > VLLM_MAX_LOGPROBS:
            raise bad_request(f"Requested sample logprobs of {top}, which is greater than max "
                              f"allowed: {VLLM_MAX_LOGPROBS}")
    return Extras(logprobs=top, token_ids=body.get("return_token_ids") is True,
                  tokens_as_ids=config.flavor == "vllm"
                  and body.get("return_tokens_as_token_ids") is True)


def _vllm_schema(body: dict[str, Any]) -> Any:
    """vLLM's schema: `structured_outputs.json`, or `response_format` `json_schema.schema`
    (`structured_outputs_from_response_format`; the latter wins)."""
    schema = None
    structured = body.get("structured_outputs")
    if isinstance(structured, dict):
        schema = structured.get("json")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        wrapper = response_format.get("json_schema")
        if not isinstance(wrapper, dict):
            raise bad_request("When response_format type is 'json_schema', the 'json_schema' "
                              "field must be provided.")
        schema = wrapper.get("schema", {})
    return schema


def _openai_logprobs(outcome: ServedItem, config: SimConfig, extras: Extras) -> Any:
    """The legacy completions `logprobs` object. vLLM (`OpenAIServingCompletion.
    _create_completion_logprobs`): `text_offset` from the tokens' lengths, the top dict of
    the first K + 1 candidates (the chosen token is one of the top K here, so K of them, one
    for K = 0), tokens as `token_id:N` with `return_tokens_as_token_ids`. SGLang
    (`to_openai_style_logprobs`): tokens by text, `text_offset` -1, no top dicts for K = 0."""
    top = extras.logprobs
    if top is None:
        return None
    completion = outcome.completion
    vllm = config.flavor == "vllm"
    scored = answers.token_logprobs(outcome.item.key, completion.output_ids,
                                    max(top, 1) if vllm else top)
    texts = completion.token_texts()
    known = dict(zip(completion.output_ids, texts, strict=True))

    def name(token: int) -> str:
        return f"token_id:{token}" if extras.tokens_as_ids else known.get(token, f"<{token}>")

    tokens = [name(token) for token in completion.output_ids]
    offsets = [-1] * len(tokens)
    if vllm:
        offsets = list(accumulate((len(t) for t in tokens[:-1]), initial=0))[:len(tokens)]
    rows = [{name(token): value for value, token in ranked} for _, ranked in scored] \
        if vllm or top > 0 else []
    return {"text_offset": offsets, "token_logprobs": [chosen for chosen, _ in scored],
            "tokens": tokens, "top_logprobs": rows}


def _openai_prompts(prompt: Any) -> list[list[int] | str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) for p in prompt):
            return [token_ids(p) for p in prompt]
        return [token_ids(prompt)]
    raise bad_request(
        "prompt must be a string, a list of token ids, or a non-empty list of either."
    )


def _stop_field(finish: dict[str, Any], config: SimConfig) -> dict[str, Any]:
    """What ended a choice. SGLang (`OpenAIServingCompletion._build_completion_response`):
    `matched_stop`, the finish reason's `matched` (a stop string, or the stop token's id).
    vLLM (`CompletionResponseChoice.stop_reason`): the stop string, null for the EOS token."""
    matched = finish.get("matched")
    if config.flavor == "vllm":
        return {"stop_reason": matched if isinstance(matched, str) else None}
    return {"matched_stop": matched}


def render_completions(job: GenerationRequest, outcomes: list[ServedItem],
                       config: SimConfig) -> dict[str, Any]:
    choices = []
    for index, outcome in enumerate(outcomes):
        finish = outcome.completion.finish_reason
        choice = {
            "index": index,
            "text": outcome.completion.text,
            "logprobs": _openai_logprobs(outcome, config, job.extras),
            "finish_reason": finish["type"],
            **_stop_field(finish, config),
        }
        if job.extras.token_ids:
            choice["token_ids"] = outcome.completion.output_ids
            prompt = outcome.item.prompt
            choice["prompt_token_ids"] = prompt if isinstance(prompt, list) else None
        choices.append(choice)
    return openai_response("text_completion", f"cmpl-{uuid.uuid4().hex}", config, choices,
                           usage_of(outcomes))


def openai_response(kind: str, response_id: str, config: SimConfig, choices: list[Any],
                    usage: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI answer's body (`object` is its kind): created now, by the served model."""
    return {"id": response_id, "object": kind, "created": int(time.time()),
            "model": config.model_name, "choices": choices, "usage": usage}


def usage_of(outcomes: list[ServedItem]) -> dict[str, int]:
    """An OpenAI answer's `usage`: each prompt counts once, however many samples (n) it
    produced."""
    n = outcomes[0].item.sampling.n if outcomes else 1
    prompt_tokens = sum(o.item.prompt_tokens for o in outcomes[::n])
    completion_tokens = sum(o.completion.completion_tokens for o in outcomes)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
