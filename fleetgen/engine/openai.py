"""OpenAI-protocol engines: `/v1/completions` with the prompt as token ids, for vLLM, llama.cpp's
server and SGLang's own `/v1`. The protocol is shared; each engine's length rule is its own."""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import replace
from typing import Any

import httpx

from fleetgen import errors
from fleetgen.engine import kinds
from fleetgen.engine.api import PLAIN, Engine, GenerateOptions, LengthRule, ServerLimits
from fleetgen.engine.client import EngineClient
from fleetgen.engine.decision import from_status
from fleetgen.engine.detect import identify_kind
from fleetgen.engine.http import (
    error_message,
    get_json,
    optional_json,
    positive_int,
    server_client,
)
from fleetgen.engine.sglang import parse_context_error as sglang_context_error
from fleetgen.engine.speculation import (
    CounterDeltas,
    get_vllm_counters,
    parse_vllm_spec,
    reports_per_request,
)
from fleetgen.records.logprobs import compact
from fleetgen.records.outcomes import Generation
from fleetgen.records.reasoning import THINK_END, THINK_START

VLLM = "vllm"
LLAMA_CPP = "llama.cpp"
SGLANG = "sglang"
ANSWERS = frozenset({"stop", "length"})
# Our sampling names in OpenAI's (vLLM and SGLang accept top_k, min_p and repetition_penalty
# as extensions).
SAMPLING_NAMES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                  "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                  "seed": "seed", "stop": "stop"}
# llama.cpp's server reads only the fields of its completion schema and ignores the rest
# (tools/server/server-schema.cpp `make_llama_cmpl_schema`, evaluated field by field in
# `eval_llama_cmpl_schema`; `params_from_json_cmpl` in older trees): its repetition penalty is
# `repeat_penalty` (`params.sampling.penalty_repeat`), so `repetition_penalty` would be
# dropped without a word.
LLAMA_CPP_NAMES = {**SAMPLING_NAMES, "repetition_penalty": "repeat_penalty"}


class ContextRule:
    """vLLM's and llama.cpp's rule: a prompt of `context` tokens or more is refused, and the
    rest of the context is the largest budget.

    vLLM 0.32.0, as a real server answered (tests/real_engines/test_vllm.py, docs/engines.md):
    `renderers/params.py` `TokenizeParams.__post_init__` refuses max_tokens > max_model_len
    whatever the prompt; `_token_len_check` a prompt longer than max_model_len ("your prompt
    contains [at least] N input tokens"); `entrypoints/serve/utils/api_utils.py`
    `get_max_tokens` then clamps max_tokens to max_model_len - input, so a prompt + max_tokens
    over the limit is a 200 cut to fit, and a prompt of exactly max_model_len a budget of 0,
    which `SamplingParams._verify_args` refuses ("max_tokens must be at least 1, got 0").
    0.33's `_validate_prompt_len` words that last one "The decoder prompt (length N) plus the
    number of requested output tokens (at least 1) is longer than ..."; older releases refused
    input + max_tokens > max_model_len ("However, you requested N tokens (P in the messages, C
    in the completion)"). context - prompt is accepted by all, and never cut.
    llama.cpp (tools/server/server-context.cpp): a prompt of n_ctx (per slot) tokens or more is
    a 400 `exceed_context_size_error`; generation stops when `prompt.n_tokens() + 1 >= n_ctx`
    in `process_token`, i.e. after n_ctx - prompt tokens, so a larger max_tokens is cut, never
    refused; n_ctx - prompt is the budget that is never cut by the context.
    """

    # get_max_tokens clamps (vLLM); process_token stops at the slot's end (llama.cpp).
    refuses_excess_budget = False

    def __init__(self, engine: str) -> None:
        self.name = engine

    def input_limit(self, limits: ServerLimits) -> int:
        return limits.context_length - limits.reserved_tokens

    def room(self, prompt_tokens: int, limits: ServerLimits) -> int:
        return limits.context_length - limits.reserved_tokens - prompt_tokens

    def correction(self, error: errors.ContextLengthError, max_tokens: int) -> int | None:
        if error.server_prompt_tokens is None or error.context_length is None:
            return None
        room = error.context_length - error.server_prompt_tokens
        return room if 0 < room < max_tokens else None


RULES: dict[str, LengthRule] = {VLLM: ContextRule(VLLM), LLAMA_CPP: ContextRule(LLAMA_CPP)}


def rule_for(engine: str) -> LengthRule:
    """The length rule of the kind behind the protocol; vLLM's for one no module declared."""
    kind = kinds.kind_of(engine)
    return kind.rule if kind is not None else RULES[VLLM]


# vLLM: "This model's maximum context length is 4096 tokens. However, your prompt contains
# 5000 input tokens, ..." (renderers/params.py `_token_len_check`); older: "However, you
# requested 5000 tokens (4000 in the messages, 1000 in the completion)".
_VLLM_CONTAINS = re.compile(r"maximum context length is (\d+) tokens\. However, your prompt "
                            r"contains (?:at least )?(\d+) input tokens")
_VLLM_REQUESTED = re.compile(r"maximum context length is (\d+) tokens\. However, you "
                             r"requested \d+ tokens \((\d+) in the messages")
_VLLM_PROMPT_LEN = re.compile(r"prompt \(length (\d+)\)(?: plus the number of requested "
                              r"output tokens \(at least 1\))? is longer than the maximum "
                              r"model length of (\d+)")
# vLLM 0.32.0, seen on the real server: a prompt of exactly max_model_len tokens is clamped to
# no budget (`entrypoints/serve/utils/api_utils.py` `get_max_tokens`: max_model_len - input)
# before any length check, so `SamplingParams._verify_args` refuses it: "max_tokens must be at
# least 1, got 0. (parameter=max_tokens, value=0)". fleetgen never sends a budget below 1:
# the 0 is the server's room for this prompt, none.
_VLLM_NO_ROOM = re.compile(r"max_tokens must be at least 1, got 0\b")
# vLLM 0.32.0 (`renderers/params.py` `TokenizeParams.__post_init__`): "max_tokens=5000 cannot be
# greater than max_model_len=4096. Please request fewer output tokens." A budget over the
# whole context, whatever the prompt (a producer told a larger --context-length).
_VLLM_OVER_CONTEXT = re.compile(r"max_tokens=\d+ cannot be greater than max_model_len=(\d+)")


def context_error(body: Any, message: str) -> tuple[int, int | None] | None:
    """(server prompt tokens, context) from any of the three engines' context-length 400s."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and err.get("type") == "exceed_context_size_error":
        # llama.cpp puts the counts in the body (server-common.cpp `format_error_response`).
        prompt, ctx = err.get("n_prompt_tokens"), err.get("n_ctx")
        if isinstance(prompt, int) and isinstance(ctx, int):
            return prompt, None if prompt >= ctx else ctx
    for pattern in (_VLLM_CONTAINS, _VLLM_REQUESTED):
        m = pattern.search(message)
        if m:
            ctx, prompt = int(m.group(1)), int(m.group(2))
            return prompt, None if prompt >= ctx else ctx
    m = _VLLM_PROMPT_LEN.search(message)
    if m:
        return int(m.group(1)), None
    return sglang_context_error(message)


def vllm_budget_error(message: str, sent: int | None) -> tuple[int | None, int | None] | None:
    """(server prompt tokens, context) from vLLM 0.32's two refusals that name no prompt count:
    the prompt is the `sent` ids (vLLM counts token-id prompts as given)."""
    if _VLLM_NO_ROOM.search(message):
        return sent, None  # the prompt fills the context: no budget helps
    m = _VLLM_OVER_CONTEXT.search(message)
    if m:
        return sent, int(m.group(1))
    return None


def from_response(response: httpx.Response, sent: int | None = None) -> errors.EngineError:
    """The error of a non-200 answer; `sent`: the prompt's length in ids, where known. Only
    its 400s mean something of their own; every other status is the common table's."""
    status = response.status_code
    message = error_message(response)
    if status == 400:
        try:
            body = response.json()
        except ValueError:
            body = None
        parsed = context_error(body, message) or vllm_budget_error(message, sent)
        if parsed is not None:
            return errors.ContextLengthError(message, status, parsed[0], parsed[1])
    return from_status(status, message)


class OpenAIClient(EngineClient):
    """Talks to one OpenAI-protocol server through /v1/completions, in the extensions of the
    engine its limits name (vllm, llama.cpp or sglang)."""

    def __init__(self, base_url: str, *, timeout_s: float, concurrency: int,
                 limits: ServerLimits, api_key: str | None = None) -> None:
        super().__init__(base_url, timeout_s=timeout_s, concurrency=concurrency,
                         api_key=api_key)
        self.rule = rule_for(limits.engine)
        self.model = limits.model
        self.engine = limits.engine  # whose extensions the body uses
        # vLLM without --per-request-spec-decode-metrics reports acceptance only on /metrics:
        # each result then carries the counters' growth since this worker began
        # (fleetgen/engine/speculation.py); off for other engines, and from the first answer
        # that carries its own acceptance (the counters would only sum those).
        self._spec = CounterDeltas(functools.partial(get_vllm_counters, self._http)
                                   if self.engine == VLLM else lambda: None)

    def generate(self, input_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any], rid: str,
                 options: GenerateOptions = PLAIN) -> Generation:
        body = completion_body(input_ids, max_new_tokens, sampling, self.model, options,
                               self.engine)
        self._spec.prime()
        started = time.monotonic()
        # vLLM takes `X-Request-Id` as the request's id (`OpenAIServing._base_request_id`: its
        # logs, its errors, `cmpl-<id>`). SGLang 0.5.23 (its /v1 reads `rid` from the body) and
        # llama.cpp's server (tools/server) never read the header.
        try:
            data = self._post("/v1/completions", body, {"X-Request-Id": rid})
        finally:
            idle = self._spec.finished()
        # The OpenAI answer carries no timing (SGLang's native meta_info has `e2e_latency`):
        # the request's wall time as this client saw it, queueing in the server included.
        gen = replace(parse_completion(data, options.logprobs),
                      latency_s=time.monotonic() - started)
        if reports_per_request(data):
            self._spec.stop()
            return gen
        counters = self._spec.snapshot(fresh=idle)
        return gen if counters is None else replace(gen, spec_counters=counters)

    def refusal(self, response: httpx.Response, body: dict[str, Any]) -> errors.EngineError:
        return from_response(response, len(body["prompt"]))


def completion_body(input_ids: list[int], max_tokens: int, sampling: dict[str, Any],
                    model: str | None, options: GenerateOptions = PLAIN,
                    engine: str = VLLM) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": input_ids, "max_tokens": max_tokens, "stream": False}
    if model:
        body["model"] = model
    names = LLAMA_CPP_NAMES if engine == LLAMA_CPP else SAMPLING_NAMES
    for key, value in sampling.items():
        body[names.get(key, key)] = value
    if engine == LLAMA_CPP and sampling.get("stop"):
        # The stop word that ended the answer is only in `__verbose` (`_stop_string`).
        body["verbose"] = True
    if options != PLAIN:
        body.update(EXTENSIONS.get(engine, vllm_options)(options))
    return body


def vllm_options(options: GenerateOptions) -> dict[str, Any]:
    """vLLM 0.33 (`entrypoints/openai/completion/protocol.py` `CompletionRequest`):
    `skip_special_tokens`; `return_token_ids` (the choice's `token_ids`, for the reasoning
    count); `structured_outputs.json` (`sampling_params.py` `StructuredOutputsParams`: a dict or
    a JSON string); `logprobs` K with `return_tokens_as_token_ids`, so every token is
    `token_id:N` (`OpenAIServingCompletion._create_completion_logprobs`) and no id is lost to
    two tokens that print alike. K above the server's `--max-logprobs` (20 by default) is its
    own 400. A reasoning parser on the server lets a grammar wait for the reasoning end."""
    extra = _special_and_ids(options)
    if options.json_schema is not None:
        extra["structured_outputs"] = {"json": options.json_schema}
    if options.logprobs > 0:
        extra.update(logprobs=options.logprobs, return_tokens_as_token_ids=True)
    return extra


def llama_cpp_options(options: GenerateOptions) -> dict[str, Any]:
    """llama.cpp's server (tools/server/server-schema.cpp `make_llama_cmpl_schema`, which
    `/v1/completions` reaches through `oaicompat_completion_params_parse` copying every field):
    `json_schema` is an object (`json_value(data, "json_schema", json::object())`); `n_probs`
    K puts `logprobs.content[*]` (id, logprob, `top_logprobs`) in the answer
    (server-task.cpp `to_json_oaicompat`); special tokens reach the text only when listed in
    `preserved_tokens` (server-context.cpp `accept_special_token`). Its OpenAI answer has no
    token ids: they come from the logprobs when asked. Its grammar applies from the first
    token: a thinking model with a schema answers without reasoning."""
    extra: dict[str, Any] = {}
    if options.keep_special_tokens:
        extra["preserved_tokens"] = [THINK_START, THINK_END]
    if options.token_ids:
        # `return_tokens` fills the result's `tokens` (server-context.cpp `process_token`:
        # `slot.generated_tokens`), but only the native shape shows them
        # (server-task.cpp `to_json_non_oaicompat`); the OpenAI shape carries that object
        # as `__verbose` when the request says `verbose` (`to_json_oaicompat`).
        extra.update(return_tokens=True, verbose=True)
    if options.json_schema is not None:
        try:
            extra["json_schema"] = json.loads(options.json_schema)
        except ValueError as exc:
            raise errors.PermanentError(f"the JSON schema is not JSON: {exc}") from exc
    if options.logprobs > 0:
        extra["n_probs"] = options.logprobs
    return extra


def sglang_options(options: GenerateOptions) -> dict[str, Any]:
    """SGLang's /v1 (`entrypoints/openai/protocol.py` `CompletionRequest`): `json_schema` (a
    string), `skip_special_tokens`, `return_token_ids`. Its logprobs are keyed by token text
    (`to_openai_style_logprobs`), so the top-K ids are lost: refused, use the native
    protocol, which returns ids."""
    if options.logprobs > 0:
        raise errors.PermanentError(
            "SGLang's /v1/completions returns log-probabilities keyed by token text, not "
            "token ids; use its native protocol for --logprobs (FLEETGEN_ENGINE_PROTOCOL="
            "sglang)")
    extra = _special_and_ids(options)
    if options.json_schema is not None:
        extra["json_schema"] = options.json_schema
    return extra


def _special_and_ids(options: GenerateOptions) -> dict[str, Any]:
    """What vLLM's and SGLang's /v1 name alike: `skip_special_tokens` false keeps `<think>` in
    the text; `return_token_ids` puts the answer's ids in the choice's `token_ids` (SGLang:
    serving_completions.py `_build_completion_response`, from `ret_item["output_ids"]`), asked
    with kept special tokens too, to count the reasoning exactly. vLLM's echoes the prompt's
    ids as well (`prompt_token_ids`): a few bytes per prompt token of answer, that count's
    price."""
    extra: dict[str, Any] = {}
    if options.keep_special_tokens:
        extra["skip_special_tokens"] = False
    if options.keep_special_tokens or options.token_ids:
        extra["return_token_ids"] = True
    return extra


EXTENSIONS = {VLLM: vllm_options, LLAMA_CPP: llama_cpp_options, SGLANG: sglang_options}


def parse_completion(data: Any, top_k: int = 0) -> Generation:
    """`choices[0]` and `usage`; a finish other than stop/length is not an answer."""
    try:
        choice = data["choices"][0]
        usage = data["usage"]
        reason = str(choice.get("finish_reason"))
        if reason not in ANSWERS:
            raise errors.AbortedError(f"engine finished with {reason!r}, not an answer")
        details = usage.get("prompt_tokens_details") or {}
        logprobs = parse_logprobs(choice.get("logprobs"), top_k)
        output_ids = _output_ids(choice, data, logprobs)
        return Generation(
            text=str(choice["text"]),
            finish_reason=reason,
            prompt_tokens=int(usage["prompt_tokens"]),
            completion_tokens=int(usage["completion_tokens"]),
            cached_tokens=int(details.get("cached_tokens") or 0),
            latency_s=0.0,  # measured by the caller, around the request
            output_ids=output_ids,
            logprobs=logprobs,
            stop_matched=_stop_string(choice, data),
            spec=parse_vllm_spec(data),
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise errors.RetryableError(f"engine response lacks {exc}", 200) from exc


def _stop_string(choice: dict[str, Any], data: dict[str, Any]) -> str | None:
    """The stop string that ended a choice: SGLang's `matched_stop`
    (`serving_completions.py`, the finish reason's `matched`), vLLM's `stop_reason`; both are
    a token id (or null) when a stop token ended it. llama.cpp's OpenAI choice names no stop
    at all: its `stopping_word` is only in the native shape (server-task.cpp
    `to_json_non_oaicompat`), which the OpenAI answer carries as `__verbose` when asked
    (`verbose`, sent with token ids), "" unless `stop_type` is "word"."""
    for name in ("matched_stop", "stop_reason"):
        value = choice.get(name)
        if isinstance(value, str):
            return value
    verbose = data.get("__verbose")
    word = verbose.get("stopping_word") if isinstance(verbose, dict) else None
    return word if isinstance(word, str) and word else None


def _output_ids(choice: dict[str, Any], data: dict[str, Any],
                logprobs: dict[str, Any] | None) -> list[int] | None:
    """The generated ids, where the answer has them: the choice's `token_ids` (vLLM, SGLang
    with `return_token_ids`), llama.cpp's `__verbose.tokens` (`return_tokens` + `verbose`),
    else the ids of the logprobs."""
    token_ids = choice.get("token_ids")
    if not isinstance(token_ids, list):
        verbose = data.get("__verbose")
        token_ids = verbose.get("tokens") if isinstance(verbose, dict) else None
    if isinstance(token_ids, list):
        return [int(i) for i in token_ids]
    return list(logprobs["ids"]) if logprobs else None


_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def parse_logprobs(logprobs: Any, top_k: int) -> dict[str, Any] | None:
    """The compact logprobs of a choice, from either shape: llama.cpp's `content` list (each
    token with its `id`, `logprob` and `top_logprobs`), or the legacy completions object
    (`tokens`, `token_logprobs`, `top_logprobs` as {token: logprob}) with vLLM's
    `token_id:N` tokens. vLLM's top dict holds the sampled token beside the top K
    (`completion_top_logprobs_limit`: K + 1): the `top_k` most likely are kept, in order."""
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    if isinstance(content, list):
        pairs = [[(t["id"], t["logprob"]) for t in item.get("top_logprobs") or []]
                 for item in content]
        return compact([item["id"] for item in content], [item["logprob"] for item in content],
                       pairs)
    tokens = logprobs.get("tokens") or []
    ids = [_token_id(token) for token in tokens]
    rows = logprobs.get("top_logprobs")
    top: list[list[tuple[int, Any]] | None] | None = None
    if rows is not None and top_k > 0:
        top = [sorted(((_token_id(t), v) for t, v in row.items()), key=lambda e: -e[1])[:top_k]
               if row else None for row in rows]
    return compact(ids, logprobs.get("token_logprobs") or [], top)


def _token_id(token: str) -> int:
    m = _TOKEN_ID.match(token)
    if m is None:
        raise errors.PermanentError(
            f"the engine returned a logprob token as text ({token[:20]!r}), not `token_id:N`: "
            "ids cannot be recovered (vLLM needs return_tokens_as_token_ids)")
    return int(m.group(1))


# -- limits ---------------------------------------------------------------------------------
def read_limits(base_url: str, *, api_key: str | None = None,
                timeout_s: float = 10.0) -> ServerLimits:
    """The limits as the kind behind the protocol reads them (SGLang's /v1 checks lengths as
    its /generate does, so its own reader); vLLM's reader for a server no kind recognises,
    which says what is missing."""
    try:
        with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
            found = identify_kind(http, prefer=OpenAIProtocol.name)
    except httpx.HTTPError:
        found = None  # the reader's own request says why, as an EngineError
    if found is None:
        return vllm_limits(base_url, api_key, timeout_s)
    return found[0].read_limits(base_url, api_key, timeout_s)


def _models_entry(http: httpx.Client) -> dict[str, Any]:
    models = get_json(http, "/v1/models")
    entry = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
    return entry if isinstance(entry, dict) else {}


def llama_cpp_limits(base_url: str, api_key: str | None = None,
                     timeout_s: float = 10.0) -> ServerLimits:
    """llama.cpp: `/props` (`default_generation_settings.n_ctx` is the per-slot context,
    `total_slots` the parallel slots), the model from `/v1/models`."""
    with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
        entry = _models_entry(http)
        props = _optional_json(http, "/props")
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if not isinstance(settings, dict) or not isinstance(settings.get("n_ctx"), int):
        raise errors.PermanentError(f"{base_url} reports no context length (/props has no "
                                    "default_generation_settings.n_ctx); pass --context-length")
    return ServerLimits(context_length=settings["n_ctx"], engine=LLAMA_CPP,
                        max_running_requests=positive_int(props.get("total_slots")),
                        running_requests_from="/props total_slots", model=entry.get("id"))


def vllm_limits(base_url: str, api_key: str | None = None,
                timeout_s: float = 10.0) -> ServerLimits:
    """vLLM (and any OpenAI server): `/v1/models` `max_model_len`."""
    with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
        entry = _models_entry(http)
    context = entry.get("max_model_len")
    if not isinstance(context, int) or context <= 0:
        raise errors.PermanentError(f"{base_url} reports no context length (/v1/models has "
                                    "no max_model_len, no /props); pass --context-length")
    return ServerLimits(context_length=context, engine=VLLM, model=entry.get("id"))


def identify_llama_cpp(http: httpx.Client) -> str | None:
    props = optional_json(http, "/props")
    if isinstance(props, dict) and "default_generation_settings" in props:
        return "/props answers (llama.cpp's server)"
    return None


def identify_openai(http: httpx.Client) -> str | None:
    """Any server whose /v1/models lists a model (vLLM, or an OpenAI server taken as one), but
    SGLang's own /v1, which its kind reads as its /generate."""
    models = optional_json(http, "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        owner = data[0].get("owned_by", "?")
        if owner == SGLANG:
            return None
        return f"/v1/models answers, owned_by {owner!r}, no SGLang server info"
    return None


def _optional_json(http: httpx.Client, path: str) -> Any:
    try:
        return optional_json(http, path)
    except httpx.HTTPError:
        return None


class OpenAIProtocol:
    """The OpenAI completions protocol as an `EngineProtocol`."""

    name = "openai"
    description = "the OpenAI protocol (/v1/completions)"
    # Every builtin kind speaks it (SGLang's /v1 too): a named choice needs no confirming.
    open_to_all = True
    rule: LengthRule = RULES[VLLM]

    def rule_for(self, limits: ServerLimits) -> LengthRule:
        return rule_for(limits.engine)

    def connect(self, base_url: str, *, timeout_s: float, concurrency: int,
                api_key: str | None = None) -> Engine:
        return OpenAIClient(base_url, timeout_s=timeout_s, concurrency=concurrency,
                            limits=read_limits(base_url, api_key=api_key), api_key=api_key)

    def read_limits(self, base_url: str, *, api_key: str | None = None,
                    timeout_s: float = 10.0) -> ServerLimits:
        return read_limits(base_url, api_key=api_key, timeout_s=timeout_s)

    def pool_size(self, limits: ServerLimits) -> int | None:
        """As the kind behind it sizes its pool (llama.cpp and SGLang say their slots; vLLM
        does not)."""
        return kinds.pool_size(limits)


PROTOCOL = OpenAIProtocol()
