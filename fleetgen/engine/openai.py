"""OpenAI-protocol engines: `/v1/completions` with the prompt as token ids, for vLLM, llama.cpp's
server and SGLang's own `/v1`. The protocol is shared; each engine's length rule is its own."""

from __future__ import annotations

import re
from typing import Any

import httpx

from fleetgen.base import errors
from fleetgen.base.outcomes import Generation
from fleetgen.engine.api import Engine, LengthRule, ServerLimits
from fleetgen.engine.health import READY_PATHS, State, probe
from fleetgen.engine.http import (
    RETRYABLE_STATUSES,
    auth_headers,
    error_message,
    from_transport,
    get_json,
    optional_json,
)
from fleetgen.engine.sglang import PROBE_TIMEOUT_S
from fleetgen.engine.sglang import RULE as SGLANG_RULE
from fleetgen.engine.sglang import parse_context_error as sglang_context_error

VLLM = "vllm"
LLAMA_CPP = "llama.cpp"
SGLANG = "sglang"
ANSWERS = frozenset({"stop", "length"})
# Our sampling names in OpenAI's (vLLM, SGLang and llama.cpp accept top_k, min_p and
# repetition_penalty as extensions; llama.cpp ignores what it does not know).
SAMPLING_NAMES = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                  "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                  "seed": "seed", "stop": "stop"}


class ContextRule:
    """vLLM's and llama.cpp's rule: a prompt of `context` tokens or more is refused, and the
    rest of the context is the largest budget.

    vLLM 0.33.0: `v1/engine/input_processor.py` `_validate_prompt_len` refuses a prompt longer
    than max_model_len ("The decoder prompt (length N) is longer than the maximum model length
    of M") or equal to it ("... plus the number of requested output tokens (at least 1) is
    longer than ..."); `entrypoints/serve/utils/api_utils.py` `get_max_tokens` then clamps
    max_tokens to max_model_len - input. Older releases refused input + max_tokens >
    max_model_len instead ("However, you requested N tokens (P in the messages, C in the
    completion)"): context - prompt is accepted by both.
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


RULES: dict[str, LengthRule] = {VLLM: ContextRule(VLLM), LLAMA_CPP: ContextRule(LLAMA_CPP),
                                SGLANG: SGLANG_RULE}

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


def from_response(response: httpx.Response) -> errors.EngineError:
    status = response.status_code
    message = error_message(response)
    if status in RETRYABLE_STATUSES:
        return errors.RetryableError(message, status)
    if status == 400:
        try:
            body = response.json()
        except ValueError:
            body = None
        parsed = context_error(body, message)
        if parsed is not None:
            return errors.ContextLengthError(message, status, parsed[0], parsed[1])
    return errors.PermanentError(message, status)


class OpenAIClient:
    """Talks to one OpenAI-protocol server. Raises only fleetgen.base.errors.EngineError."""

    def __init__(self, base_url: str, *, timeout_s: float, concurrency: int,
                 api_key: str | None = None, model: str | None = None,
                 rule: LengthRule = RULES[VLLM]) -> None:
        limits = httpx.Limits(max_connections=concurrency + 4,
                              max_keepalive_connections=concurrency + 4)
        timeout = httpx.Timeout(timeout_s, connect=5.0, pool=timeout_s)
        self.base_url = base_url.rstrip("/")
        self.rule = rule
        self.model = model
        self._ready_paths: tuple[str, ...] = READY_PATHS
        self._http = httpx.Client(base_url=self.base_url, headers=auth_headers(api_key),
                                  limits=limits, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def generate(self, input_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any], rid: str) -> Generation:
        body = completion_body(input_ids, max_new_tokens, sampling, self.model)
        try:
            # vLLM and SGLang take `X-Request-Id` as the request's id in their logs.
            response = self._http.post("/v1/completions", json=body,
                                       headers={"X-Request-Id": rid})
        except httpx.HTTPError as exc:
            raise from_transport(exc) from exc
        if response.status_code != 200:
            raise from_response(response)
        try:
            data = response.json()
        except ValueError as exc:
            raise errors.RetryableError(f"engine sent invalid JSON: {exc}", 200) from exc
        return parse_completion(data)

    def healthy(self) -> bool:
        """Ready or slow (never a generation probe): /ready (SGLang), /health (vLLM, llama.cpp
        answer it at once)."""
        result, path = probe(self._http, PROBE_TIMEOUT_S, self._ready_paths)
        if path is not None:
            self._ready_paths = (path,)
        return result.state in (State.READY, State.SLOW)


def completion_body(input_ids: list[int], max_tokens: int, sampling: dict[str, Any],
                    model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": input_ids, "max_tokens": max_tokens, "stream": False}
    if model:
        body["model"] = model
    for key, value in sampling.items():
        body[SAMPLING_NAMES.get(key, key)] = value
    return body


def parse_completion(data: Any) -> Generation:
    """`choices[0]` and `usage`; a finish other than stop/length is not an answer."""
    try:
        choice = data["choices"][0]
        usage = data["usage"]
        reason = str(choice.get("finish_reason"))
        if reason not in ANSWERS:
            raise errors.AbortedError(f"engine finished with {reason!r}, not an answer")
        details = usage.get("prompt_tokens_details") or {}
        return Generation(
            text=str(choice["text"]),
            finish_reason=reason,
            prompt_tokens=int(usage["prompt_tokens"]),
            completion_tokens=int(usage["completion_tokens"]),
            cached_tokens=int(details.get("cached_tokens") or 0),
            latency_s=0.0,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise errors.RetryableError(f"engine response lacks {exc}", 200) from exc


# -- limits ---------------------------------------------------------------------------------
def read_limits(base_url: str, *, api_key: str | None = None,
                timeout_s: float = 10.0) -> ServerLimits:
    """llama.cpp: `/props` (`default_generation_settings.n_ctx` is the per-slot context,
    `total_slots` the parallel slots). vLLM and SGLang: `/v1/models` `max_model_len`."""
    with httpx.Client(base_url=base_url.rstrip("/"), headers=auth_headers(api_key),
                      timeout=timeout_s) as http:
        models = get_json(http, "/v1/models")
        entry = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
        props = _optional_json(http, "/props")
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    if isinstance(settings, dict) and isinstance(settings.get("n_ctx"), int):
        return ServerLimits(context_length=settings["n_ctx"], engine=LLAMA_CPP,
                            max_running_requests=_positive(props.get("total_slots")),
                            model=entry.get("id"))
    context = entry.get("max_model_len")
    if not isinstance(context, int) or context <= 0:
        raise errors.PermanentError(f"{base_url} reports no context length (/v1/models has "
                                    "no max_model_len, no /props); pass --context-length")
    engine = SGLANG if entry.get("owned_by") == "sglang" else VLLM
    return ServerLimits(context_length=context, engine=engine, model=entry.get("id"))


def _optional_json(http: httpx.Client, path: str) -> Any:
    try:
        return optional_json(http, path)
    except httpx.HTTPError:
        return None


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


class OpenAIProtocol:
    """The OpenAI completions protocol as an `EngineProtocol`."""

    name = "openai"
    rule: LengthRule = RULES[VLLM]

    def rule_for(self, limits: ServerLimits) -> LengthRule:
        return RULES.get(limits.engine, RULES[VLLM])

    def connect(self, base_url: str, *, timeout_s: float, concurrency: int,
                api_key: str | None = None) -> Engine:
        limits = read_limits(base_url, api_key=api_key)
        return OpenAIClient(base_url, timeout_s=timeout_s, concurrency=concurrency,
                            api_key=api_key, model=limits.model, rule=self.rule_for(limits))

    def read_limits(self, base_url: str, *, api_key: str | None = None,
                    timeout_s: float = 10.0) -> ServerLimits:
        return read_limits(base_url, api_key=api_key, timeout_s=timeout_s)

    def pool_size(self, limits: ServerLimits) -> int | None:
        """llama.cpp says its slots (K + 1 threads, as for SGLang); vLLM does not say."""
        slots = limits.max_running_requests
        return slots + 1 if slots else None


PROTOCOL = OpenAIProtocol()
