"""SGLang's request rules and response shapes: parsing, validation, context limits, bodies."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.config import SimConfig
from simulator.model import MAX_INPUT_ID, Completion, count_text_tokens, request_key

QUEUE_FULL_MESSAGE = "The request queue is full."
DEFAULT_MAX_NEW_TOKENS = 128  # native /generate
DEFAULT_MAX_TOKENS = 16  # OpenAI /v1/completions


class ApiError(Exception):
    """A request answered with an error status; the endpoint decides the body shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters that change what the simulator does (the rest are checked only)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1


@dataclass(frozen=True)
class Item:
    """One generation to run: a prompt under its final (clamped) token limit."""

    rid: str  # reported as meta_info.id
    abort_rid: str  # what /abort_request matches (the client's rid, shared by n samples)
    prompt_tokens: int  # as the server counts them, extra_prompt_tokens included
    key: int
    max_new_tokens: int
    sampling: Sampling


@dataclass(frozen=True)
class Job:
    items: list[Item]
    batch: bool  # answer with a list, in item order


@dataclass(frozen=True)
class Outcome:
    item: Item
    completion: Completion
    e2e_latency_s: float


# ---------------------------------------------------------------- error bodies


def native_error_body(error: ApiError) -> dict[str, Any]:
    """A ValueError becomes {"error": {...}}; anything 5xx is shaped like an HTTPException."""
    if error.status < 500:
        return {"error": {"message": error.message}}
    return http_exception_body(error)


def openai_error_body(error: ApiError) -> dict[str, Any]:
    if error.status < 500:
        return {
            "object": "error", "message": error.message, "type": "BadRequestError",
            "param": None, "code": error.status,
        }
    return http_exception_body(error)


def http_exception_body(error: ApiError) -> dict[str, Any]:
    return {
        "object": "error", "message": error.message, "type": str(error.status),
        "param": None, "code": error.status,
    }


# ---------------------------------------------------------------- context rules


def fit_to_context(prompt_tokens: int, max_new_tokens: int, config: SimConfig) -> int:
    """Apply SGLang's three length checks in its order; return the clamped new-token limit."""
    context = config.context_length
    if prompt_tokens >= context:
        raise bad_request(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
    total = prompt_tokens + max_new_tokens
    if total > context:
        raise bad_request(
            f"Requested token count exceeds the model's maximum context length of {context} "
            f"tokens. You requested a total of {total} tokens: {prompt_tokens} tokens from the "
            f"input messages and {max_new_tokens} tokens for the completion. Please reduce the "
            "number of tokens in the input messages or the completion to fit within the limit."
        )
    if prompt_tokens >= config.max_req_input_len:
        raise bad_request(
            f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
            f"({config.max_req_input_len} tokens). Use a shorter input or enable "
            "--allow-auto-truncate."
        )
    # The scheduler trims silently; a client that trusted its own budget never notices.
    return min(max_new_tokens, config.max_req_len - prompt_tokens - 1)


# ---------------------------------------------------------------- sampling params

# (name, default, accepted?, message). Messages follow SGLang's wording.
_RANGE_RULES: tuple[tuple[str, float, Callable[[float], bool], str], ...] = (
    ("temperature", 1.0, lambda v: v >= 0, "temperature must be non-negative, got {}."),
    ("top_p", 1.0, lambda v: 0 < v <= 1, "top_p must be in (0, 1], got {}."),
    ("top_k", -1, lambda v: v == -1 or v >= 1,
     "top_k must be -1 (disable), or at least 1, got {}."),
    ("min_p", 0.0, lambda v: 0 <= v <= 1, "min_p must be in [0, 1], got {}."),
    ("frequency_penalty", 0.0, lambda v: -2 <= v <= 2,
     "frequency_penalty must be in [-2, 2], got {}."),
    ("presence_penalty", 0.0, lambda v: -2 <= v <= 2,
     "presence_penalty must be in [-2, 2], got {}."),
    ("repetition_penalty", 1.0, lambda v: 0 < v <= 2,
     "repetition_penalty must be in (0, 2], got {}."),
)
_INTEGER_PARAMS = frozenset({"top_k", "max_new_tokens", "min_new_tokens", "n"})


def parse_sampling(raw: Any) -> Sampling:
    """Validate sampling params as SGLang does; unknown keys are ignored, null means default."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise bad_request("sampling_params must be a JSON object.")
    for name, default, accepted, message in _RANGE_RULES:
        value = _number(raw, name, default)
        if not accepted(value):
            raise bad_request(message.format(value))
    max_new = int(_number(raw, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    if max_new < 0:
        raise bad_request(f"max_new_tokens must be at least 0, got {max_new}.")
    min_new = int(_number(raw, "min_new_tokens", 0))
    if not 0 <= min_new <= max_new:
        raise bad_request(f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.")
    n = int(_number(raw, "n", 1))
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.")
    ignore_eos = raw.get("ignore_eos") or False
    if not isinstance(ignore_eos, bool):
        raise bad_request(f"ignore_eos must be a boolean, got {ignore_eos!r}.")
    return Sampling(max_new, min_new, ignore_eos, n)


def _number(raw: dict[str, Any], name: str, default: float) -> float:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{name} must be a number, got {value!r}.")
    if name in _INTEGER_PARAMS and not isinstance(value, int):
        raise bad_request(f"{name} must be an integer, got {value!r}.")
    return value


# ---------------------------------------------------------------- native /generate


def parse_generate(body: Any, config: SimConfig) -> Job:
    """Turn a native /generate body into checked items (400 on the first bad one)."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    _refuse_stream(body)
    prompts, batch = _native_prompts(body)
    samplings = _per_prompt(body.get("sampling_params"), len(prompts), batch)
    rids = _rids(body.get("rid"), len(prompts), batch)
    return _build_job(prompts, samplings, rids, batch, config)


def _native_prompts(body: dict[str, Any]) -> tuple[list[list[int] | str], bool]:
    input_ids, text = body.get("input_ids"), body.get("text")
    if (input_ids is None) == (text is None):
        raise bad_request("Exactly one of text or input_ids must be given.")
    if text is not None:
        if isinstance(text, str):
            return [text], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return list(text), True
        raise bad_request("text must be a string or a non-empty list of strings.")
    if isinstance(input_ids, list) and input_ids and all(isinstance(i, list) for i in input_ids):
        return [_token_ids(ids) for ids in input_ids], True
    return [_token_ids(input_ids)], False


def _token_ids(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(
        type(token) is int and 0 <= token <= MAX_INPUT_ID for token in value
    ):
        raise bad_request(
            "input_ids must be a list of non-negative token ids, or a list of such lists."
        )
    return value


def _per_prompt(raw: Any, count: int, batch: bool) -> list[Sampling]:
    if isinstance(raw, list):
        if not batch or len(raw) != count:
            raise bad_request("A list of sampling_params needs a batch of the same length.")
        return [parse_sampling(one) for one in raw]
    return [parse_sampling(raw)] * count


def _rids(raw: Any, count: int, batch: bool) -> list[str]:
    if raw is None:
        return [uuid.uuid4().hex for _ in range(count)]
    if not batch and isinstance(raw, str):
        return [raw]
    if batch and isinstance(raw, list) and len(raw) == count and all(
        isinstance(r, str) for r in raw
    ):
        return list(raw)
    raise bad_request("rid must be a string, or for a batch a list with one string per input.")


def _build_job(
    prompts: Sequence[list[int] | str],
    samplings: Sequence[Sampling],
    rids: Sequence[str],
    batch: bool,
    config: SimConfig,
) -> Job:
    items: list[Item] = []
    for prompt, sampling, rid in zip(prompts, samplings, rids, strict=True):
        sent = count_text_tokens(prompt) if isinstance(prompt, str) else len(prompt)
        if sent == 0:
            raise bad_request("The input is empty.")
        prompt_tokens = sent + config.extra_prompt_tokens
        max_new = fit_to_context(prompt_tokens, sampling.max_new_tokens, config)
        for index in range(sampling.n):
            items.append(Item(
                rid=rid if sampling.n == 1 else f"{rid}-{index}",
                abort_rid=rid,
                prompt_tokens=prompt_tokens,
                key=request_key(config.seed, prompt, index),
                max_new_tokens=max_new,
                sampling=sampling,
            ))
    # n > 1 turns even a single prompt into a list answer, as SGLang does.
    return Job(items, batch or len(items) > 1)


def render_native(job: Job, outcomes: list[Outcome], config: SimConfig) -> Any:
    answers = [
        {
            "text": outcome.completion.text,
            "output_ids": outcome.completion.output_ids,
            "meta_info": {
                "id": outcome.item.rid,
                "finish_reason": outcome.completion.finish_reason,
                "prompt_tokens": outcome.item.prompt_tokens,
                "completion_tokens": outcome.completion.completion_tokens,
                "cached_tokens": 0,
                "e2e_latency": round(outcome.e2e_latency_s, 6),
            },
        }
        for outcome in outcomes
    ]
    return answers if job.batch else answers[0]


def _refuse_stream(body: dict[str, Any]) -> None:
    if body.get("stream"):
        raise bad_request("The simulator does not stream; send \"stream\": false.")


# ---------------------------------------------------------------- OpenAI /v1/completions

_OPENAI_TO_SAMPLING = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
_OPENAI_SAMPLING_KEYS = (
    *(name for name, *_ in _RANGE_RULES), "n", "ignore_eos", *_OPENAI_TO_SAMPLING,
)


def parse_completions(body: Any, config: SimConfig) -> Job:
    """Turn an OpenAI completions body (prompt as text or token ids) into checked items."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    _refuse_stream(body)
    prompts = _openai_prompts(body.get("prompt"))
    raw = {
        _OPENAI_TO_SAMPLING.get(key, key): body[key]
        for key in _OPENAI_SAMPLING_KEYS
        if body.get(key) is not None
    }
    raw.setdefault("max_new_tokens", DEFAULT_MAX_TOKENS)
    sampling = parse_sampling(raw)
    rid = body.get("rid")
    base = rid if isinstance(rid, str) else uuid.uuid4().hex
    rids = [base] if len(prompts) == 1 else [f"{base}-p{i}" for i in range(len(prompts))]
    return _build_job(prompts, [sampling] * len(prompts), rids, True, config)


def _openai_prompts(prompt: Any) -> list[list[int] | str]:
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) for p in prompt):
            return [_token_ids(p) for p in prompt]
        return [_token_ids(prompt)]
    raise bad_request(
        "prompt must be a string, a list of token ids, or a non-empty list of either."
    )


def render_completions(job: Job, outcomes: list[Outcome], config: SimConfig) -> dict[str, Any]:
    choices = []
    for index, outcome in enumerate(outcomes):
        finish = outcome.completion.finish_reason
        choices.append({
            "index": index,
            "text": outcome.completion.text,
            "logprobs": None,
            "finish_reason": finish["type"],
            "matched_stop": finish.get("matched"),
        })
    # Each prompt counts once in usage, however many samples (n) it produced.
    n = outcomes[0].item.sampling.n if outcomes else 1
    prompt_tokens = sum(o.item.prompt_tokens for o in outcomes[::n])
    completion_tokens = sum(o.completion.completion_tokens for o in outcomes)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": config.model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
