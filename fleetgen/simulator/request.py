"""What every API surface of a simulated server shares: the request model (items, sampling,
extras), its errors, the context and sampling rules, and the job an endpoint's parser builds.
Each protocol's parsing and bodies are its own module: sglang_api.py (SGLang's native
/generate) and openai_api.py (OpenAI's /v1/completions, as SGLang and vLLM serve it).

The checks run in SGLang 0.5.23's order: the contract gate (fleetgen/simulator/contract.py),
`GenerateReqInput.normalize_batch_and_arguments`, the duplicate-rid check of
`TokenizerManager._init_req_state`, `_validate_one_request` (context rules, with
the speculative reserve), `SamplingParams.verify`, then the scheduler's
`init_req_max_new_tokens` clamp and `validate_input_length`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetgen.simulator import answers
from fleetgen.simulator import pattern as patterns
from fleetgen.simulator.answers import Style
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.model import MAX_INPUT_ID, Completion, count_text_tokens, request_key
from fleetgen.simulator.schema import SchemaRefused, check_sglang, check_vllm

QUEUE_FULL_MESSAGE = "The request queue is full."
DEFAULT_MAX_NEW_TOKENS = 128  # native /generate: SamplingParams.max_new_tokens
DEFAULT_MAX_TOKENS = 16  # OpenAI /v1/completions
# `_handle_abort_req`: a request aborted before it ran gets this message.
WAITING_ABORT_MESSAGE = "Abort in waiting queue"
# FINISH_ABORT().to_json(): what a request aborted while running finishes with.
RUNNING_ABORT_REASON: dict[str, Any] = {
    "type": "abort", "message": "Aborted", "status_code": None, "err_type": None,
}


class ApiError(Exception):
    """A request answered with an error status; the endpoint decides the body shape."""

    def __init__(self, status: int, message: str, *, contract: bool = False,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.contract = contract  # the contract gate answers {"error": "<string>"}
        self.param = param  # vLLM's `ErrorInfo.param`: the parameter it refused


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


@dataclass(frozen=True)
class SamplingParams:
    """The sampling parameters that change what the simulator does (the rest are checked only)."""

    max_new_tokens: int | None = None  # None: not sent, so the tokenizer check skips it
    min_new_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1
    sampling_seed: int | None = None
    stop: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Item:
    """One generation to run: a prompt under its final (clamped) token limit."""

    rid: str  # meta_info.id, and what /abort_request and the duplicate check match
    prompt: list[int] | str
    prompt_tokens: int  # as the server counts them, extra_prompt_tokens included
    key: int
    max_new_tokens: int
    sampling: SamplingParams
    style: Style = answers.PLAIN


@dataclass(frozen=True)
class Extras:
    """What a request asks for in its answer beyond the text (the same for all its items)."""

    logprobs: int | None = None  # top-K per output token; None: no logprobs
    logprob_text: bool = False  # SGLang `return_text_in_logprobs`
    token_ids: bool = False  # OpenAI `return_token_ids`: the choice's `token_ids`
    tokens_as_ids: bool = False  # vLLM `return_tokens_as_token_ids`: `token_id:N` tokens
    require_reasoning: bool = False  # SGLang: the grammar waits for `</think>`
    verbose: bool = False  # llama.cpp `verbose`: the native result as `__verbose`


@dataclass(frozen=True)
class GenerationRequest:
    items: list[Item]
    batch: bool  # answer with a list, in item order
    extras: Extras = Extras()


@dataclass(frozen=True)
class ServedItem:
    item: Item
    completion: Completion
    e2e_latency_s: float
    cached_tokens: int = 0
    num_retractions: int = 0
    waiting_abort: bool = False  # aborted before it ran: the reduced meta_info


InFlight = Callable[[str], bool]  # is this rid in flight on the server?


def http_exception_body(error: ApiError) -> dict[str, Any]:
    return {
        "object": "error", "message": error.message, "type": str(error.status),
        "param": None, "code": error.status,
    }


def validate_context(prompt_tokens: int, max_new_tokens: int | None, config: SimConfig) -> None:
    """`TokenizerManager._validate_one_request`: the reserve counts, a missing limit does not."""
    context = config.context_length
    input_tokens = prompt_tokens + config.num_reserved_tokens
    if input_tokens >= context:
        raise bad_request(
            f"The input ({input_tokens} tokens) is longer than the model's context length "
            f"({context} tokens)."
        )
    if max_new_tokens is None:
        return  # `sampling_params.get("max_new_tokens")` is None: the check is skipped
    total = input_tokens + max_new_tokens
    if total > context:
        raise bad_request(
            f"Requested token count exceeds the model's maximum context length of {context} "
            f"tokens. You requested a total of {total} tokens: {input_tokens} tokens from the "
            f"input messages and {max_new_tokens} tokens for the completion. Please reduce the "
            "number of tokens in the input messages or the completion to fit within the limit."
        )


def auto_truncate(prompt: list[int] | str, prompt_tokens: int, max_new_tokens: int | None,
                  config: SimConfig) -> tuple[list[int] | str, int, int | None]:
    """`--allow-auto-truncate`: `_validate_one_request` cuts the input to the context (and then
    counts it without the reserve) and `max_new_tokens` to what is left; the scheduler's
    `validate_input_length` cuts the input again to `max_req_input_len`. Nothing is refused."""
    context = config.context_length
    counted = prompt_tokens + config.num_reserved_tokens
    if counted >= context:
        # `del input_ids[_max_req_len:]; input_token_num = len(input_ids)`
        prompt_tokens = counted = min(prompt_tokens, context)
    if max_new_tokens is not None and max_new_tokens + counted > context:
        max_new_tokens = max(0, context - counted)
    prompt_tokens = min(prompt_tokens, config.max_req_input_len)
    if isinstance(prompt, list):  # the ids the server keeps, for the answer key
        prompt = prompt[:max(1, prompt_tokens - config.extra_prompt_tokens)]
    return prompt, prompt_tokens, max_new_tokens


def schedule_limit(prompt_tokens: int, max_new_tokens: int | None, config: SimConfig) -> int:
    """Scheduler `init_req_max_new_tokens` then `validate_input_length`: the clamped limit."""
    wanted = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
    limit = max(0, min(wanted, config.max_req_len - prompt_tokens - 1))
    # Base allocator `max_new_tokens_for_memory`: what an empty pool could hold.
    # It clamps to 0 rather than refusing; only SWA/hybrid pools return None,
    # which is the "KV memory budget" 400 (docs/simulator.md).
    page = config.page_size
    paged_input = -(-prompt_tokens // page) * page
    limit = max(0, min(limit, config.max_total_num_tokens - paged_input - page - 1))
    if prompt_tokens >= config.max_req_input_len and not config.allow_auto_truncate:
        raise bad_request(
            f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
            f"({config.max_req_input_len} tokens). Use a shorter input or enable "
            "--allow-auto-truncate."
        )
    return limit


def vllm_refusal(message: str, param: str, value: object) -> ApiError:
    """vLLM 0.32.0's `VLLMValidationError`: its text names the parameter and the value
    (`(parameter=max_tokens, value=0)`), and the error body's `param` the parameter."""
    return ApiError(400, f"{message} (parameter={param}, value={value})", param=param)


def vllm_limit(prompt_tokens: int, max_tokens: int | None, config: SimConfig) -> int:
    """vLLM 0.32.0's rule, as the real server answered it (tests/real_engines/test_vllm.py):
    `renderers/params.py` `TokenizeParams.__post_init__` refuses max_tokens over
    max_model_len, `_token_len_check` a prompt longer than max_model_len ("at least" when it
    is one over: a text prompt is tokenized to at most that), then
    `entrypoints/serve/utils/api_utils.py` `get_max_tokens` clamps max_tokens to what is left
    (a 200 cut to fit) and `SamplingParams._verify_args` refuses a budget below 1, which is
    also how a prompt of exactly max_model_len is refused."""
    context = config.context_length
    if max_tokens is not None and max_tokens > context:
        raise vllm_refusal(f"max_tokens={max_tokens} cannot be greater than max_model_len="
                           f"{context}. Please request fewer output tokens.", "max_tokens",
                           max_tokens)
    if prompt_tokens > context:
        qualifier = "at least " if prompt_tokens == context + 1 else ""
        raise vllm_refusal(
            f"This model's maximum context length is {context} tokens. However, your prompt "
            f"contains {qualifier}{prompt_tokens} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt.",
            "input_tokens", prompt_tokens)
    wanted = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    limit = min(wanted, context - prompt_tokens)
    if limit < 1:
        raise vllm_refusal(f"max_tokens must be at least 1, got {limit}.", "max_tokens", limit)
    return limit


# (name, accepted?, message): `SamplingParams.verify`, in its order.
RANGE_RULES: tuple[tuple[str, Callable[[float], bool], str], ...] = (
    ("temperature", lambda v: v >= 0 and v != float("inf"),
     "temperature must be a non-negative finite number, got {}."),
    ("top_p", lambda v: 0 < v <= 1, "top_p must be in (0, 1], got {}."),
    ("min_p", lambda v: 0 <= v <= 1, "min_p must be in [0, 1], got {}."),
    ("top_k", lambda v: v == -1 or v >= 1,
     "top_k must be -1 (disable) or at least 1, got {}."),
    ("frequency_penalty", lambda v: -2 <= v <= 2,
     "frequency_penalty must be in [-2, 2], got {}."),
    ("presence_penalty", lambda v: -2 <= v <= 2,
     "presence_penalty must be in [-2, 2], got {}."),
    ("repetition_penalty", lambda v: 0 < v <= 2,
     "repetition_penalty must be in (0, 2] (1.0 = no penalty), got {}."),
)
_INTEGER_PARAMS = frozenset({"top_k", "max_new_tokens", "min_new_tokens", "n", "sampling_seed"})


def parse_sampling(raw: Any) -> SamplingParams:
    """Read the parameters the simulator uses (types only; `verify` checks ranges later)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise bad_request("sampling_params must be a JSON object.")
    for name in ("temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                 "presence_penalty", "repetition_penalty"):
        _number(raw, name, 0)
    max_new = raw.get("max_new_tokens")
    if max_new is not None:
        max_new = int(_number(raw, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    n = int(_number(raw, "n", 1))
    if n < 1:  # the simulator's own rule: SGLang has no check and misbehaves
        raise bad_request(f"n must be at least 1, got {n}.")
    seed = raw.get("sampling_seed")
    ignore_eos = raw.get("ignore_eos") or False
    if not isinstance(ignore_eos, bool):
        raise bad_request(f"ignore_eos must be a boolean, got {ignore_eos!r}.")
    return SamplingParams(
        max_new_tokens=max_new,
        min_new_tokens=int(_number(raw, "min_new_tokens", 0)),
        ignore_eos=ignore_eos,
        n=n,
        sampling_seed=None if seed is None else int(_number(raw, "sampling_seed", 0)),
        stop=_stop_strings(raw.get("stop")),
        raw=raw,
    )


# sampling/sampling_params.py
MAX_STOP_COUNT = 32


def _stop_strings(value: Any) -> tuple[str, ...]:
    """`SamplingParams.normalize`: a string is a list of one; more than MAX_STOP_COUNT is a
    ValueError (400). An empty string never matches here (SGLang's `"" in tail` would end
    every request at its first token; the simulator does not model that)."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(v, str) for v in stops):
        raise bad_request(f"stop must be a string or a list of strings, got {value!r}.")
    if len(stops) > MAX_STOP_COUNT:
        raise bad_request(f"at most {MAX_STOP_COUNT} stop strings are allowed, "
                          f"got {len(stops)}")
    return tuple(v for v in stops if v)


def verify_sampling(sampling: SamplingParams) -> None:
    """`SamplingParams.verify` (srt/sampling/sampling_params.py): 400 on the first bad value."""
    raw = sampling.raw
    for name, accepted, message in RANGE_RULES:
        value = raw.get(name)
        if value is not None and not accepted(value):
            raise bad_request(message.format(value))
    if sampling.min_new_tokens < 0:
        raise bad_request(
            f"min_new_tokens must be in [0, max_new_tokens], got {sampling.min_new_tokens}."
        )
    max_new = DEFAULT_MAX_NEW_TOKENS if sampling.max_new_tokens is None else (
        sampling.max_new_tokens
    )
    if max_new < 0:
        raise bad_request(f"max_new_tokens must be at least 0, got {max_new}.")
    if sampling.min_new_tokens > max_new:
        raise bad_request(
            f"min_new_tokens must be in [0, max_new_tokens({max_new})], got "
            f"{sampling.min_new_tokens}."
        )


def _number(raw: dict[str, Any], name: str, default: float) -> float:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{name} must be a number, got {value!r}.")
    if name in _INTEGER_PARAMS and not isinstance(value, int):
        raise bad_request(f"{name} must be an integer, got {value!r}.")
    return value


def token_ids(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(
        type(token) is int and 0 <= token <= MAX_INPUT_ID for token in value
    ):
        raise bad_request(
            "input_ids must be a list of non-negative token ids, or a list of such lists."
        )
    return value


def refuse_duplicates(rids: Sequence[str], in_flight: InFlight) -> None:
    """`TokenizerManager._init_req_state`: a rid still in flight on this server is a 400."""
    for rid in rids:
        if in_flight(rid):
            raise bad_request(f"Duplicate request ID detected: {rid}")


def build_job(
    prompts: Sequence[list[int] | str],
    samplings: Sequence[SamplingParams],
    rids: Sequence[str],
    batch: bool,
    config: SimConfig,
    extras: Extras = Extras(),
) -> GenerationRequest:
    items: list[Item] = []
    for index, (prompt, sampling) in enumerate(zip(prompts, samplings, strict=True)):
        sent = count_text_tokens(prompt) if isinstance(prompt, str) else len(prompt)
        if sent == 0:
            raise bad_request("The input is empty.")
        prompt_tokens = sent + config.extra_prompt_tokens
        wanted = sampling.max_new_tokens
        if config.flavor == "vllm":
            verify_sampling(sampling)
            max_new = vllm_limit(prompt_tokens, wanted, config)
        else:
            if config.allow_auto_truncate:
                prompt, prompt_tokens, wanted = auto_truncate(prompt, prompt_tokens, wanted,
                                                              config)
            else:
                validate_context(prompt_tokens, wanted, config)
            verify_sampling(sampling)
            max_new = schedule_limit(prompt_tokens, wanted, config)
        for sample in range(sampling.n):
            rid = rids[index * sampling.n + sample]
            key = request_key(config.seed, prompt, sample, sampling.sampling_seed)
            items.append(Item(
                # `_handle_batch_request` gives each parallel sample a fresh uuid rid.
                rid=uuid.uuid4().hex if sampling.n > 1 else rid,
                prompt=prompt,
                prompt_tokens=prompt_tokens,
                key=key,
                max_new_tokens=max_new,
                sampling=sampling,
                style=style_of(sampling, key, config, extras, prompt),
            ))
    return GenerationRequest(items, batch, extras)


def style_of(sampling: SamplingParams, key: int, config: SimConfig, extras: Extras,
             prompt: Sequence[int] | str = ()) -> Style:
    """How the item's answer is shaped. The schema is checked after the length rules, as
    SGLang compiles grammars in the scheduler.

    Only a server with a reasoning parser lets a grammar wait for `</think>`: SGLang wraps its
    grammar backend in a `ReasonerGrammarBackend` only when `--reasoning-parser` is set
    (`constrained/base_grammar_backend.py` `create_grammar_backend`; the plain grammar
    objects' `maybe_init_reasoning` does nothing), and then waits when asked
    (`require_reasoning`). vLLM's parser waits by itself, unless the prompt already ended the
    reasoning (its structured-output manager asks the parser `is_reasoning_end` of the
    prompt's ids)."""
    raw = sampling.raw
    schema, regex = raw.get("json_schema"), raw.get("regex")
    grammars = ("json_schema", "regex", "ebnf", "structural_tag")
    if config.flavor != "vllm" and sum(raw.get(name) is not None for name in grammars) > 1:
        # SamplingParams.verify
        raise bad_request("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
    if regex is not None:
        try:
            regex = patterns.check(regex)
        except patterns.PatternRefused as error:
            raise bad_request(str(error)) from None
    if schema is not None:
        try:
            schema = check_vllm(schema) if config.flavor == "vllm" else check_sglang(schema)
        except SchemaRefused as error:
            raise bad_request(str(error)) from None
    skip = raw.get("skip_special_tokens")
    if skip is not None and not isinstance(skip, bool):
        raise bad_request(f"skip_special_tokens must be a boolean, got {skip!r}.")
    parser = config.reasoning_parser is not None
    if config.flavor == "vllm":
        waits = parser and answers.opening(prompt) is not answers.Opening.ANSWER
    else:
        waits = parser and extras.require_reasoning
    return Style(
        thinking=config.thinking,
        schema=schema,
        regex=regex,
        reasoning_first=waits,
        skip_special_tokens=True if skip is None else skip,
        broken_json=schema is not None and answers.breaks_json(key, config.json_invalid_rate),
        stop=sampling.stop,
        stop_sees_special=config.flavor != "vllm",
        stop_trim=config.flavor == "vllm" or raw.get("no_stop_trim") is not True,
        min_new_tokens=sampling.min_new_tokens,
        ignore_eos=sampling.ignore_eos,
    )


def refuse_stream(body: dict[str, Any]) -> None:
    if body.get("stream"):
        raise bad_request("The simulator does not stream; send \"stream\": false.")
