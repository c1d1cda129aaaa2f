"""SGLang's native protocol: the `/generate` client, its limits, its length rule, its errors.

Read against SGLang's source (python/sglang/srt/...); see ../shared/notes/sglang-protocol.md.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import httpx

from fleetgen import errors
from fleetgen.engine import kinds
from fleetgen.engine.api import PLAIN, Engine, GenerateOptions, LengthRule, ServerLimits
from fleetgen.engine.client import EngineClient
from fleetgen.engine.decision import from_status
from fleetgen.engine.http import (
    error_message,
    get_json,
    optional_json,
    positive_int,
    server_client,
)
from fleetgen.engine.preflight import combine
from fleetgen.records.logprobs import compact
from fleetgen.records.outcomes import Generation

# schedule_batch.py FINISH_MATCHED_TOKEN / FINISH_MATCHED_STR / FINISHED_MATCHED_REGEX report
# "stop", FINISH_LENGTH "length": the only finishes that are whole answers.
FINISHED = frozenset({"stop", "length"})
# TokenizerManager._init_req_state: `raise ValueError(f"Duplicate request ID detected: {rid}")`
DUPLICATE_RID = "Duplicate request ID detected"

# The scheduler (scheduler.py, `max_req_input_len = max_req_len - 5`) refuses an input of
# max_req_input_len tokens or more, where max_req_len = min(context_len - 1, kv_capacity - 1).
SCHEDULER_INPUT_MARGIN = 5


class SGLangRule:
    """SGLang's length checks. Every request is silently clamped to `max_req_len - input - 1`
    new tokens, so the largest budget sent as-is is context_len - input - 2; that also keeps
    input + max_new_tokens strictly below context_len, inside the tokenizer manager's check
    (`_validate_one_request`) in both its old (>=) and new (>) forms."""

    name = "sglang"
    refuses_excess_budget = True  # `_validate_one_request`: max_new + input > context -> 400

    @staticmethod
    def max_req_len(limits: ServerLimits) -> int:
        if limits.max_total_tokens is None:
            return limits.context_length - 1
        return min(limits.context_length - 1, limits.max_total_tokens - 1)

    def input_limit(self, limits: ServerLimits) -> int:
        # The tokenizer manager counts the speculative reserve with the input
        # (`input_token_num += self.num_reserved_tokens`); the scheduler does not, and its
        # limit is the server's own `max_req_input_len` where the server reports it.
        scheduler = limits.max_req_input_len or \
            self.max_req_len(limits) - SCHEDULER_INPUT_MARGIN
        return min(scheduler, limits.context_length - limits.reserved_tokens)

    def room(self, prompt_tokens: int, limits: ServerLimits) -> int:
        clamp = self.max_req_len(limits) - prompt_tokens - 1
        total = limits.context_length - limits.reserved_tokens - prompt_tokens - 1
        return min(clamp, total)

    def correction(self, error: errors.ContextLengthError, max_tokens: int) -> int | None:
        if error.server_prompt_tokens is None or error.context_length is None:
            return None
        # By the server's count the input breaks the scheduler's limit too: no budget helps.
        # (The server's count already holds any speculative reserve.)
        server = ServerLimits(context_length=error.context_length)
        if error.server_prompt_tokens >= self.input_limit(server):
            return None
        room = self.room(error.server_prompt_tokens, server)
        return room if 0 < room < max_tokens else None


RULE = SGLangRule()


class SGLangClient(EngineClient):
    """Talks to one SGLang server (or router) through its native /generate."""

    rule = RULE

    def generate(self, input_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any], rid: str,
                 options: GenerateOptions = PLAIN) -> Generation:
        body = generate_body(input_ids, max_new_tokens, sampling, rid, options)
        return parse_generation(self._post("/generate", body))

    def refusal(self, response: httpx.Response, body: dict[str, Any]) -> errors.EngineError:
        return from_response(response)


def generate_body(input_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                  rid: str, options: GenerateOptions = PLAIN) -> dict[str, Any]:
    """A native /generate request. The options in 0.5.23's names (`managers/io_struct.py`
    `GenerateReqInput`): `return_logprob` and `top_logprobs_num` at the top level, with
    `logprob_start_len` left at -1 so only output tokens are scored (`Scheduler.
    handle_generate_request` sets it to the input's length); `require_reasoning` at the top
    level too, so a grammar waits for `</think>` (`GrammarManager.process_req_with_grammar` ->
    `ReasonerGrammarObject.maybe_init_reasoning`); the rest are sampling params."""
    params = sampling_params(sampling, max_new_tokens)
    if options.keep_special_tokens:
        params["skip_special_tokens"] = False
    if options.json_schema is not None:
        params["json_schema"] = options.json_schema  # a JSON string (`SamplingParams`)
    body: dict[str, Any] = {"input_ids": input_ids, "sampling_params": params, "rid": rid,
                            "stream": False}
    if options.logprobs > 0:
        body.update(return_logprob=True, top_logprobs_num=options.logprobs)
    if options.reasoning_first:
        body["require_reasoning"] = True
    return body


def sampling_params(sampling: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """Our sampling options in SGLang's names. `seed` is SGLang's `sampling_seed`."""
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for key, value in sampling.items():
        params["sampling_seed" if key == "seed" else key] = value
    return params


def parse_generation(data: Any) -> Generation:
    """A finished answer, or an error: a 200 is not always one. An aborted request comes back
    as 200 (tokenizer_manager.py `_handle_abort_finish_reason` raises only for an abort that
    carries a status code; the rest are returned): partial text and full meta_info when it
    was running, no prompt_tokens when it was waiting. Both are retried, never written."""
    if isinstance(data, list):  # a batch of one
        data = data[0]
    try:
        meta = data["meta_info"]
        reason = meta.get("finish_reason") or {}
        finish = reason.get("type")
    except (KeyError, TypeError, AttributeError) as exc:
        raise errors.RetryableError(f"engine response lacks {exc}", 200) from exc
    if finish == "abort":
        message = reason.get("message") or "no message"
        raise errors.AbortedError(f"request aborted by the server: {message}", 200)
    if finish not in FINISHED:
        raise errors.RetryableError(f"engine finished with {finish!r}, not stop or length", 200)
    try:
        output_ids = data.get("output_ids")
        return Generation(
            text=data["text"],
            finish_reason=str(finish),
            prompt_tokens=int(meta["prompt_tokens"]),
            completion_tokens=int(meta["completion_tokens"]),
            cached_tokens=int(meta.get("cached_tokens", 0)),
            latency_s=float(meta.get("e2e_latency", 0.0)),
            output_ids=[int(i) for i in output_ids] if isinstance(output_ids, list) else None,
            logprobs=parse_logprobs(meta),
            # FINISH_MATCHED_STR: a string; FINISH_MATCHED_TOKEN: the token's id.
            stop_matched=reason.get("matched") if isinstance(reason.get("matched"), str)
            else None,
            spec=parse_spec(meta),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise errors.RetryableError(f"engine response lacks {exc}", 200) from exc


# meta_info's speculative fields as 0.5.23 names them (`TokenizerManager.
# _calculate_spec_decoding_metrics`), each with the names earlier releases used: read
# defensively, since a field missing or renamed must never fail a row.
SPEC_NAMES = {
    "accept_length": ("spec_accept_length",),
    "accept_rate": ("spec_accept_rate",),
    "correct_drafts": ("spec_num_correct_drafts", "spec_accepted_drafts",
                       "spec_num_accepted_drafts"),
    "proposed_drafts": ("spec_num_proposed_drafts", "spec_proposed_drafts"),
    "histogram": ("spec_correct_drafts_histogram", "spec_accept_histogram"),
}


def parse_spec(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A finished answer's speculative figures as one `spec` object, or None when the server
    gives none (no speculative algorithm, or an answer whose only token came from the prefill:
    SGLang sets the fields only when `spec_verify_ct > 0`). `accept_length` is the server's,
    else completion tokens / verify steps, as SGLang computes it."""
    verify_ct = _number(meta.get("spec_verify_ct"))
    if verify_ct is None or verify_ct <= 0:
        return None
    spec: dict[str, Any] = {"verify_ct": int(verify_ct)}
    for name, keys in SPEC_NAMES.items():
        value = next((meta[key] for key in keys if meta.get(key) is not None), None)
        if name == "histogram":
            if isinstance(value, list) and all(_number(v) is not None for v in value):
                spec[name] = [int(v) for v in value]
        elif _number(value) is not None:
            spec[name] = value
    if "accept_length" not in spec and _number(meta.get("completion_tokens")) is not None:
        spec["accept_length"] = int(meta["completion_tokens"]) / int(verify_ct)
    return spec


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def parse_logprobs(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The compact logprobs (fleetgen/records/logprobs.py) of a native answer, or None when not
    asked. 0.5.23's shape (`TokenizerManager.add_logprob_to_meta_info`,
    `detokenize_logprob_tokens`): `output_token_logprobs` is a list of `[logprob, token_id,
    text-or-null]`, `output_top_logprobs` a list (one per output token) of such lists, or null
    at a position without any (`detokenize_top_logprobs_tokens`)."""
    scored = meta.get("output_token_logprobs")
    if scored is None:
        return None
    top_rows = meta.get("output_top_logprobs")
    top = None if top_rows is None else [
        [(entry[1], entry[0]) for entry in row] if row else None for row in top_rows]
    return compact([entry[1] for entry in scored], [entry[0] for entry in scored], top)


# -- errors ---------------------------------------------------------------------------------
_REQUESTED = re.compile(
    r"maximum context length of (\d+) tokens.*?(\d+) tokens from the input", re.S)
_INPUT_LONGER = re.compile(r"input \((\d+) tokens\) is longer than the model's context length "
                           r"\((\d+) tokens\)")
_INPUT_ALLOWED = re.compile(r"Input length \((\d+) tokens\) exceeds the maximum allowed "
                            r"length \((\d+) tokens\)")


def from_response(response: httpx.Response) -> errors.EngineError:
    """Translate an error response; the only place that reads SGLang's error bodies. Only its
    400s mean something of their own; every other status is the common table's."""
    status = response.status_code
    message = error_message(response)
    if status == 400 and message.startswith(DUPLICATE_RID):
        # An earlier delivery of this prompt still runs there; the next attempt's rid is new.
        return errors.DuplicateRidError(message, status)
    if status == 400:
        parsed = parse_context_error(message)
        if parsed is not None:
            prompt_tokens, context = parsed
            return errors.ContextLengthError(message, status, prompt_tokens, context)
    return from_status(status, message)


def parse_context_error(message: str) -> tuple[int, int | None] | None:
    """(server prompt tokens, context length) from SGLang's three length errors. The context
    is None when the input alone is too long: then no smaller budget can help."""
    m = _REQUESTED.search(message)
    if m:
        return int(m.group(2)), int(m.group(1))
    m = _INPUT_LONGER.search(message) or _INPUT_ALLOWED.search(message)
    if m:
        return int(m.group(1)), None
    return None


# -- limits ---------------------------------------------------------------------------------
# Speculative algorithms whose draft tokens sit in the output slots, so the tokenizer manager
# adds a reserve to every input in its length checks (managers/utils.py
# `compute_num_reserved_tokens`: EAGLE family only; NEXTN is resolved to EAGLE at start-up).
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP"})


def read_limits(base_url: str, *, api_key: str | None = None,
                timeout_s: float = 10.0) -> ServerLimits:
    """Context length from /v1/models (`max_model_len`), the rest from the server info
    (http_server.py `server_info`): KV capacity, the input limit, the speculative reserve, the
    running requests in force, and whether a sampling seed is honoured."""
    with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
        models = get_json(http, "/v1/models")
        entry = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
        context = entry.get("max_model_len")
        info = _server_info(http)
        if info.get("router_manager"):
            return router_limits(http, api_key=api_key, timeout_s=timeout_s)
    if context is None:
        context = info.get("context_length")
    if not isinstance(context, int) or context <= 0:
        raise errors.PermanentError(f"{base_url} reports no context length (/v1/models has no "
                                    "max_model_len); pass --context-length")
    if isinstance(info.get("context_length"), int) and info["context_length"] < context:
        context = info["context_length"]
    deterministic = info.get("enable_deterministic_inference")
    return ServerLimits(context_length=context,
                        max_total_tokens=positive_int(info.get("max_total_num_tokens")),
                        max_running_requests=running_requests(info),
                        running_requests_from=running_requests_source(info),
                        dp_size=positive_int(info.get("dp_size")) or 1,
                        model=entry.get("id"),
                        max_req_input_len=positive_int(info.get("max_req_input_len")),
                        reserved_tokens=reserved_tokens(info),
                        deterministic=deterministic if isinstance(deterministic, bool) else None,
                        skip_tokenizer_init=info.get("skip_tokenizer_init") is True,
                        reasoning_parser=_text(info.get("reasoning_parser")))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def router_limits(http: httpx.Client, *, api_key: str | None, timeout_s: float) -> ServerLimits:
    """An SGLang router (sglang-router 0.3.2: `/get_server_info` is
    `{"router_manager": true, ...}`, `/v1/models` has no max_model_len, `/server_info` is
    404) says nothing of the limits, but `/workers` lists the servers behind it: read each,
    and keep what holds on all of them (the smallest context wins)."""
    urls = listed_servers(http)
    servers = [read_limits(url, api_key=api_key, timeout_s=timeout_s) for url in urls]
    fleet = combine(servers, RULE)
    running = [s.max_running_requests for s in servers]
    return replace(fleet, servers_behind=len(servers), running_requests_from="the servers "
                   "behind the router", max_running_requests=sum(r for r in running if r)
                   if all(running) else None)


def listed_servers(http: httpx.Client) -> list[str]:
    """The URLs of the servers an SGLang router lists in `/workers`."""
    listed = get_json(http, "/workers")
    urls = [w["url"] for w in (listed.get("workers") or []) if isinstance(w, dict)
            and isinstance(w.get("url"), str)] if isinstance(listed, dict) else []
    if not urls:
        raise errors.PermanentError("the SGLang router lists no servers behind it (/workers)")
    return urls


def servers_behind(base_url: str, *, api_key: str | None = None,
                   timeout_s: float = 10.0) -> list[str]:
    """The servers behind `base_url` if it is an SGLang router, else []."""
    with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
        info = _server_info(http)
        return listed_servers(http) if info.get("router_manager") else []


def running_requests(info: dict[str, Any]) -> int | None:
    """The requests the server runs at once. The top-level `max_running_requests` is the CLI
    value (null unless passed); the value in force is per DP rank in `internal_states`
    (scheduler_components/internal_state.py: `effective_max_running_requests_per_dp`)."""
    per_rank = _per_rank(info)
    if per_rank:
        dp_size = positive_int(info.get("dp_size")) or 1
        # One entry per DP rank; a server that lists one for all ranks multiplies.
        ranks = dp_size if len(per_rank) == 1 else 1
        return sum(per_rank) * ranks
    return positive_int(info.get("max_running_requests"))


def running_requests_source(info: dict[str, Any]) -> str | None:
    """Which field `running_requests` read: "internal_states", "max_running_requests" or
    None (neither says)."""
    if _per_rank(info):
        return "internal_states"
    return "max_running_requests" if positive_int(info.get("max_running_requests")) else None


def _per_rank(info: dict[str, Any]) -> list[int]:
    """`effective_max_running_requests_per_dp` of every DP rank, or [] unless all report it."""
    states = info.get("internal_states")
    if not isinstance(states, list):
        return []
    per_rank = [positive_int(s.get("effective_max_running_requests_per_dp"))
                for s in states if isinstance(s, dict)]
    return [v for v in per_rank if v] if per_rank and all(per_rank) else []


def reserved_tokens(info: dict[str, Any]) -> int:
    """`compute_num_reserved_tokens`: max(topk x steps, draft tokens) for the EAGLE family."""
    algorithm = str(info.get("speculative_algorithm") or "").upper()
    if algorithm not in EAGLE_FAMILY:
        return 0
    topk = positive_int(info.get("speculative_eagle_topk")) or 0
    steps = positive_int(info.get("speculative_num_steps")) or 0
    drafts = positive_int(info.get("speculative_num_draft_tokens")) or 0
    return max(topk * steps, drafts)


def _server_info(http: httpx.Client) -> dict[str, Any]:
    # /server_info first: /get_server_info is deprecated and logs a warning on every call.
    for path in ("/server_info", "/get_server_info"):
        try:
            response = http.get(path)
        except httpx.HTTPError:
            return {}
        if response.status_code == 200:
            body = response.json()
            return body if isinstance(body, dict) else {}
    return {}


def identify(http: httpx.Client) -> str | None:
    """SGLang and its router answer /server_info (or the older /get_server_info); neither vLLM
    nor llama.cpp has that endpoint."""
    for path in ("/server_info", "/get_server_info"):
        info = optional_json(http, path)
        if isinstance(info, dict) and info.get("router_manager"):
            return f"{path} describes an SGLang router"
        if isinstance(info, dict):
            return f"{path} answers (SGLang {info.get('version', 'of unknown version')})"
    return None


def grammar_cannot_wait(url: str, limits: ServerLimits, protocol: str) -> str | None:
    """SGLang 0.5.23 lets a grammar wait for `</think>` only with `--reasoning-parser`
    (`constrained/base_grammar_backend.py` `create_grammar_backend` wraps the backend in a
    `ReasonerGrammarBackend` only then; the plain grammar objects ignore `require_reasoning`),
    and only on /generate (its /v1/completions `CompletionRequest` has no
    `require_reasoning`)."""
    if protocol != SGLangProtocol.name:
        return (f"{url} is SGLang's /v1/completions, which cannot make a grammar wait for "
                "</think>; use its native protocol (FLEETGEN_ENGINE_PROTOCOL=sglang) with "
                "--reasoning-parser qwen3 on the server")
    # max_req_input_len: the server info was read, and it lists every server argument.
    if limits.reasoning_parser is None and limits.max_req_input_len is not None:
        return (f"{url} runs no reasoning parser, so its grammar holds from the first token, "
                "inside the reasoning; restart it with --reasoning-parser qwen3")
    return None


class SGLangProtocol:
    """SGLang's native protocol as an `EngineProtocol`."""

    name = "sglang"
    description = "SGLang's native protocol"
    open_to_all = False  # only SGLang (and its router) serve /generate
    rule = RULE

    def connect(self, base_url: str, *, timeout_s: float, concurrency: int,
                api_key: str | None = None) -> Engine:
        return SGLangClient(base_url, timeout_s=timeout_s, concurrency=concurrency,
                            api_key=api_key)

    def rule_for(self, limits: ServerLimits) -> LengthRule:
        return RULE

    def read_limits(self, base_url: str, *, api_key: str | None = None,
                    timeout_s: float = 10.0) -> ServerLimits:
        return read_limits(base_url, api_key=api_key, timeout_s=timeout_s)

    def pool_size(self, limits: ServerLimits) -> int | None:
        """K + 1 threads for K running slots; None behind a router (`kinds.slots_plus_one`)."""
        return kinds.pool_size(limits)


PROTOCOL = SGLangProtocol()
