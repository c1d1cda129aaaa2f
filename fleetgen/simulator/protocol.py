"""SGLang's request rules and response shapes: parsing, validation, context limits, bodies.

The checks run in SGLang 0.5.23's order: the contract gate (fleetgen/simulator/contract.py),
`GenerateReqInput.normalize_batch_and_arguments`, the duplicate-rid check of
`TokenizerManager._init_req_state`, `_validate_one_request` (context rules, with
the speculative reserve), `SamplingParams.verify`, then the scheduler's
`init_req_max_new_tokens` clamp and `validate_input_length`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

from fleetgen.simulator import answers
from fleetgen.simulator import pattern as patterns
from fleetgen.simulator.answers import Style
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.contract import generate_contract_error
from fleetgen.simulator.model import MAX_INPUT_ID, Completion, count_text_tokens, request_key
from fleetgen.simulator.schema import SchemaRefused, check_sglang, check_vllm
from fleetgen.simulator.spec import meta_info_fields, steps_for

QUEUE_FULL_MESSAGE = "The request queue is full."
DEFAULT_MAX_NEW_TOKENS = 128  # native /generate: SamplingParams.max_new_tokens
DEFAULT_MAX_TOKENS = 16  # OpenAI /v1/completions
WEIGHT_VERSION = "default"
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


# ---------------------------------------------------------------- error bodies


def native_error_body(error: ApiError) -> Any:
    """Contract gate: a string; ValueError: {"error": {...}}; 5xx: an HTTPException body."""
    if error.contract:
        return {"error": error.message}
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


def vllm_error_body(error: ApiError) -> dict[str, Any]:
    """vLLM's `ErrorResponse` (entrypoints/serve/engine/protocol.py): {"error": ErrorInfo}."""
    kind = "BadRequestError" if error.status < 500 else "InternalServerError"
    return {"error": {"message": error.message, "type": kind, "param": error.param,
                      "code": error.status}}


# ---------------------------------------------------------------- sampling params

# (name, accepted?, message): `SamplingParams.verify`, in its order.
_RANGE_RULES: tuple[tuple[str, Callable[[float], bool], str], ...] = (
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
    for name, accepted, message in _RANGE_RULES:
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


# ---------------------------------------------------------------- native /generate


def parse_generate(body: Any, config: SimConfig, in_flight: InFlight) -> GenerationRequest:
    """Turn a native /generate body into checked items (400 on the first bad one)."""
    error = generate_contract_error(body)
    if error is not None:
        raise ApiError(400, error, contract=True)
    assert isinstance(body, dict)  # the contract gate refuses anything else
    _refuse_stream(body)
    prompts, batch = _native_prompts(body)
    samplings = _per_prompt(body.get("sampling_params"), len(prompts), batch)
    n = samplings[0].n if samplings else 1
    if any(s.n != n for s in samplings):
        raise bad_request(
            "The parallel_sample_num should be the same for all samples in sample params."
        )
    # `_handle_parallel_sampling`: n > 1 turns even a single prompt into a batch.
    batch = batch or n > 1
    rids = _rids(body.get("rid"), len(prompts), n, batch)
    _refuse_duplicates(rids, in_flight)
    return _build_job(prompts, samplings, rids, batch, config, _native_extras(body))


def _native_extras(body: dict[str, Any]) -> Extras:
    """`GenerateReqInput`'s `return_logprob`, `top_logprobs_num`, `return_text_in_logprobs`
    and `require_reasoning` (types checked by the contract gate). `logprob_start_len` is left
    at -1: only output tokens are scored (`Scheduler.handle_generate_request`)."""
    wanted, top = body.get("return_logprob"), body.get("top_logprobs_num")
    if isinstance(wanted, list) or isinstance(top, list):
        raise bad_request("The simulator takes return_logprob and top_logprobs_num as single "
                          "values, not per-item lists.")
    return Extras(logprobs=int(top or 0) if wanted else None,
                  logprob_text=bool(body.get("return_text_in_logprobs")),
                  require_reasoning=bool(body.get("require_reasoning")))


def _native_prompts(body: dict[str, Any]) -> tuple[list[list[int] | str], bool]:
    input_ids, text = body.get("input_ids"), body.get("text")
    if input_ids is None and text is None:
        raise bad_request("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        if isinstance(text, str):
            return [text], False
        return list(text), True
    if isinstance(input_ids, list) and not input_ids:
        raise bad_request("input_ids cannot be empty.")
    if isinstance(input_ids, list) and all(isinstance(i, list) for i in input_ids):
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


def _per_prompt(raw: Any, count: int, batch: bool) -> list[SamplingParams]:
    if isinstance(raw, list):
        if not batch or len(raw) != count:
            raise bad_request("A list of sampling_params needs a batch of the same length.")
        return [parse_sampling(one) for one in raw]
    return [parse_sampling(raw)] * count


def _rids(raw: Any, count: int, n: int, batch: bool) -> list[str]:
    """`_normalize_rid`: a string rid of a batch is a prefix, `<rid>_<i>` per expanded item."""
    if not batch:
        return [raw if isinstance(raw, str) else uuid.uuid4().hex]
    expanded = count * n
    if raw is None:
        return [uuid.uuid4().hex for _ in range(expanded)]
    if isinstance(raw, str):
        return [f"{raw}_{i}" for i in range(expanded)]
    if len(raw) != count:
        raise bad_request(
            "The specified rids length mismatch with the batch_size for batch processing."
        )
    rids = [rid for rid in raw for _ in range(n)] if n > 1 else list(raw)
    if len(set(raw)) != len(raw):
        duplicates = sorted({rid for rid in raw if raw.count(rid) > 1}, key=raw.index)
        raise bad_request(f"Duplicate request IDs detected within the request: {duplicates}")
    return rids


def _refuse_duplicates(rids: Sequence[str], in_flight: InFlight) -> None:
    """`TokenizerManager._init_req_state`: a rid still in flight on this server is a 400."""
    for rid in rids:
        if in_flight(rid):
            raise bad_request(f"Duplicate request ID detected: {rid}")


def _build_job(
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


def render_native(job: GenerationRequest, outcomes: list[ServedItem], config: SimConfig) -> Any:
    bodies = [_native_answer(outcome, config, job.extras) for outcome in outcomes]
    return bodies if job.batch else bodies[0]


def _native_answer(outcome: ServedItem, config: SimConfig, extras: Extras) -> dict[str, Any]:
    completion = outcome.completion
    tokens = completion.completion_tokens
    meta: dict[str, Any]
    if outcome.waiting_abort:
        # `_handle_abort_req`: no prompt_tokens, cached_tokens or num_retractions.
        meta = {
            "id": outcome.item.rid,
            "finish_reason": completion.finish_reason,
            "weight_version": WEIGHT_VERSION,
            "e2e_latency": round(outcome.e2e_latency_s, 6),
            "weight_versions": [{"version": WEIGHT_VERSION, "start": 0, "end": 0}],
            "completion_tokens": tokens,
        }
        return {"text": completion.text, "output_ids": completion.output_ids, "meta_info": meta}
    # `_handle_batch_output` (+ e2e_latency when finished).
    cached = outcome.cached_tokens
    meta = {
        "id": outcome.item.rid,
        "finish_reason": completion.finish_reason,
        "prompt_tokens": outcome.item.prompt_tokens,
        "weight_version": WEIGHT_VERSION,
        "num_retractions": outcome.num_retractions,
        **_native_logprobs(outcome, config, extras),
        "reasoning_tokens": answers.reasoning_tokens(
            completion.output_ids, config.reasoning_parser is not None,
            extras.require_reasoning),
        "completion_tokens": tokens,
        "cached_tokens": cached,
        "weight_versions": [{"version": WEIGHT_VERSION, "start": 0, "end": tokens}],
        "cached_tokens_details": {"device": cached, "host": 0} if cached else None,
        "e2e_latency": round(outcome.e2e_latency_s, 6),
        **_spec_fields(outcome, config),
    }
    answer: dict[str, Any] = {"output_ids": completion.output_ids, "meta_info": meta}
    if not config.skip_tokenizer_init:  # BatchTokenIDOutput carries no text
        answer = {"text": completion.text, **answer}
    return answer


def _spec_fields(outcome: ServedItem, config: SimConfig) -> dict[str, Any]:
    """The speculative fields a finished request gets after `e2e_latency` when the server runs
    a speculative algorithm (`_handle_batch_output` -> `_calculate_spec_decoding_metrics`)."""
    if config.speculative_algorithm is None:
        return {}
    tokens = outcome.completion.completion_tokens
    item = outcome.item
    return meta_info_fields(steps_for(config, item.key, item.prompt, tokens), tokens)


def _native_logprobs(outcome: ServedItem, config: SimConfig, extras: Extras) -> dict[str, Any]:
    """`TokenizerManager.add_logprob_to_meta_info`: `[logprob, token_id, text-or-null]` per
    output token (`detokenize_logprob_tokens`; text only with `return_text_in_logprobs` and a
    tokenizer), the top-K lists when `top_logprobs_num` > 0, and the input's, empty: with
    `logprob_start_len` -1 no input token is scored."""
    if extras.logprobs is None:
        return {}
    completion = outcome.completion
    with_text = extras.logprob_text and not config.skip_tokenizer_init
    texts = completion.token_texts() if with_text else [None] * completion.completion_tokens
    scored = answers.token_logprobs(outcome.item.key, completion.output_ids, extras.logprobs)
    fields: dict[str, Any] = {
        "input_token_logprobs": [],
        "output_token_logprobs": [[chosen, token, text] for (chosen, _), token, text
                                  in zip(scored, completion.output_ids, texts, strict=True)],
        "output_token_logprobs_length": completion.completion_tokens,
    }
    if extras.logprobs > 0:
        # The simulator has no tokenizer: a runner-up that is not a token of the answer is
        # shown by its id.
        known = dict(zip(completion.output_ids, texts, strict=True))
        fields["input_top_logprobs"] = []
        fields["output_top_logprobs"] = [
            [[value, token, known.get(token, f"<{token}>") if with_text else None]
             for value, token in top]
            for _, top in scored]
    return fields


def _refuse_stream(body: dict[str, Any]) -> None:
    if body.get("stream"):
        raise bad_request("The simulator does not stream; send \"stream\": false.")


# ---------------------------------------------------------------- OpenAI /v1/completions

_OPENAI_TO_SAMPLING = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
                       "seed": "sampling_seed"}
_OPENAI_SAMPLING_KEYS = (
    *(name for name, *_ in _RANGE_RULES), "n", "ignore_eos", "skip_special_tokens", "stop",
    *_OPENAI_TO_SAMPLING,
)


def parse_completions(body: Any, config: SimConfig, in_flight: InFlight, *,
                      require_reasoning: bool = False) -> GenerationRequest:
    """Turn an OpenAI completions body (prompt as text or token ids) into checked items.
    `require_reasoning`: the chat path's, from the thinking mode (chat.py)."""
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
    _refuse_duplicates(rids, in_flight)
    return _build_job(prompts, [sampling] * len(prompts), rids, True, config, extras)


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
            return [_token_ids(p) for p in prompt]
        return [_token_ids(prompt)]
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
