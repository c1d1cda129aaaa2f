"""Conformance table: each behaviour of SGLang 0.5.23 the simulator models, over real HTTP.

One row per behaviour: the SGLang function it follows (paths under
`python/sglang/` of the 0.5.23 wheel), the simulator settings, one exchange, and
the exact status and body. Bodies are compared whole after `normalize`, which
only masks values that vary by run (latencies, uuid rids, times) and shortens
the deterministic answer text to its length.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import jsonschema
import pytest

from tests.support.sim import ENDLESS, StartSim, generate, stats
from tests.support.waiting import wait_until

CONTEXT = 100  # max_req_len 99, max_req_input_len 94
SLOW = {"tpot_ms": 100.0, "output_tokens_mean": ENDLESS}  # LONG tokens take 9 s
LONG = 90  # fits the context of 100 beside a prompt of a few tokens
UUID = re.compile(r"^[0-9a-f]{32}$")

SAMPLING_FIELDS = (
    "`max_new_tokens`, `stop`, `stop_token_ids`, `stop_regex`, `temperature`, `top_p`, "
    "`top_k`, `min_p`, `frequency_penalty`, `presence_penalty`, `repetition_penalty`, "
    "`min_new_tokens`, `n`, `json_schema`, `regex`, `ebnf`, `structural_tag`, `ignore_eos`, "
    "`skip_special_tokens`, `spaces_between_special_tokens`, `no_stop_trim`, "
    "`stream_interval`, `logit_bias`, `sampling_seed`, `custom_params`, `beam_width`, "
    "`watermark`, `choice`"
)


def normalize(value: Any) -> Any:
    """Mask what varies by run; answers become their length (they are tested elsewhere)."""
    if isinstance(value, list):
        return [normalize(item) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in {"e2e_latency", "startup_time"}:
            out[key] = "<seconds>"
        elif key.startswith("spec_"):
            out[key] = "<drafts>"  # the draws are tested in test_sim_spec.py
        elif key == "id" and isinstance(item, str) and UUID.match(item):
            out[key] = "<uuid>"
        elif key == "text":
            out[key] = f"<{len(item.split())} words>" if item else ""
        elif key == "output_ids":
            out[key] = f"<{len(item)} ids>"
        else:
            out[key] = normalize(item)
    return out


def meta(rid: str, finish: dict[str, Any], prompt: int, tokens: int, cached: int = 0,
         retractions: int = 0) -> dict[str, Any]:
    """The meta_info of a finished (or running-aborted) request, `_handle_batch_output`."""
    return {
        "id": rid, "finish_reason": finish, "prompt_tokens": prompt,
        "weight_version": "default", "num_retractions": retractions, "reasoning_tokens": 0,
        "completion_tokens": tokens, "cached_tokens": cached,
        "weight_versions": [{"version": "default", "start": 0, "end": tokens}],
        "cached_tokens_details": {"device": cached, "host": 0} if cached else None,
        "e2e_latency": "<seconds>",
    }


def answer(rid: str, finish: dict[str, Any], prompt: int, tokens: int, **more: int
           ) -> dict[str, Any]:
    return {"text": f"<{tokens} words>" if tokens else "", "output_ids": f"<{tokens} ids>",
            "meta_info": meta(rid, finish, prompt, tokens, **more)}


def spec_answer(rid: str, finish: dict[str, Any], prompt: int, tokens: int) -> dict[str, Any]:
    """A finished answer of a speculating server: the spec fields after e2e_latency."""
    body = answer(rid, finish, prompt, tokens)
    body["meta_info"].update(dict.fromkeys((
        "spec_accept_rate", "spec_accept_length", "spec_num_correct_drafts",
        "spec_num_proposed_drafts", "spec_verify_ct", "spec_correct_drafts_histogram"),
        "<drafts>"))
    return body


def length(n: int) -> dict[str, Any]:
    return {"type": "length", "length": n}


def message(text: str) -> dict[str, Any]:
    return {"error": {"message": text}}


ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


@dataclass
class Ctx:
    """What an exchange gets: a client on the first server, a thread pool, the sim."""

    client: httpx.Client
    pool: ThreadPoolExecutor
    sim: Any

    def later(self, *args: Any, **kwargs: Any) -> Future[httpx.Response]:
        return self.pool.submit(generate, self.client, *args, **kwargs)

    def running(self, count: int) -> None:
        wait_until(lambda: stats(self.client)["num_running_reqs"] == count, what="running")

    def queued(self, count: int) -> None:
        wait_until(lambda: stats(self.client)["num_queue_reqs"] == count, what="queued")

    def abort(self, body: dict[str, Any]) -> None:
        response = self.client.post("/abort_request", json=body)
        assert (response.status_code, response.content) == (200, b"")

    def sampled(self, params: dict[str, Any], ids: list[int] | None = None) -> httpx.Response:
        return self.client.post("/generate", json={
            "input_ids": ids or [1, 2], "sampling_params": params, "rid": "r"})


Exchange = Callable[[Ctx], httpx.Response | Any]


@dataclass
class Case:
    id: str
    source: str  # the SGLang 0.5.23 function the behaviour comes from
    exchange: Exchange
    status: int | None  # None: the exchange returns a body, not a response
    body: Any
    config: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ exchanges


def abort_running(ctx: Ctx) -> httpx.Response:
    running = ctx.later([1, 2, 3], LONG, rid="long")
    ctx.running(1)
    wait_until(lambda: stats(ctx.client)["busy_slot_seconds_total"] > 0.35, what="tokens out")
    ctx.abort({"rid": "long"})
    return running.result()


def abort_waiting(ctx: Ctx) -> httpx.Response:
    ctx.later([1], LONG, rid="first")
    ctx.running(1)
    waiting = ctx.later([2, 3], LONG, rid="second")
    ctx.queued(1)
    ctx.abort({"rid": "second"})
    response = waiting.result()
    ctx.abort({"abort_all": True})
    return response


def abort_prefix(ctx: Ctx) -> list[Any]:
    """The exact rid must be in flight; then every rid it starts is ended."""
    one, ten = ctx.later([1], LONG, rid="job-1"), ctx.later([2], LONG, rid="job-10")
    ctx.running(2)
    ctx.abort({"rid": "job-1"})
    return [one.result().json()["meta_info"]["finish_reason"],
            ten.result().json()["meta_info"]["finish_reason"]]


def abort_prefix_without_exact(ctx: Ctx) -> Any:
    run = ctx.later([1], 10, rid="job-1")  # 0.2 s
    ctx.running(1)
    ctx.abort({"rid": "job"})  # the tokenizer holds no rid "job": ignored
    ctx.abort({"rid": ""})  # empty rid without abort_all: ignored
    return run.result().json()["meta_info"]["finish_reason"]


def abort_all(ctx: Ctx) -> list[Any]:
    futures = [ctx.later([i], LONG, rid=f"x{i}") for i in range(2)]
    ctx.running(2)
    ctx.abort({"abort_all": True})
    return [f.result().json()["meta_info"]["finish_reason"] for f in futures]


def duplicate_rid(ctx: Ctx) -> httpx.Response:
    first = ctx.later([1], LONG, rid="dup")
    ctx.running(1)
    response = generate(ctx.client, [1], 5, rid="dup")
    ctx.abort({"rid": "dup"})
    first.result()
    return response


def batch(rid: Any, prompts: int = 2) -> Exchange:
    return lambda ctx: ctx.client.post("/generate", json={
        "input_ids": [[7 + i, 8] for i in range(prompts)],  # no shared prefix: nothing cached
        "sampling_params": {"max_new_tokens": 3}, "rid": rid})


def info(path: str, *keys: str) -> Exchange:
    def run(ctx: Ctx) -> Any:
        body = ctx.client.get(path).json()
        states = body["internal_states"]
        return {
            **{key: body[key] for key in keys},
            "dp_ranks": len(states),
            "per_dp": [s["effective_max_running_requests_per_dp"] for s in states],
        }
    return run


INFO_KEYS = ("max_running_requests", "max_req_input_len", "max_total_num_tokens",
             "context_length", "speculative_algorithm", "speculative_num_draft_tokens",
             "enable_deterministic_inference", "skip_tokenizer_init", "version")


def health_timing(ctx: Ctx) -> Any:
    started = time.monotonic()
    ready = ctx.client.get("/ready").status_code
    ready_s = time.monotonic() - started
    health = ctx.client.get("/health")
    health_s = time.monotonic() - started - ready_s
    return {"ready": ready, "ready_fast": ready_s < 0.5, "health": health.status_code,
            "health_at_least_1s": health_s >= 1.0}


def draining(ctx: Ctx) -> Any:
    long = ctx.later([1], 25, rid="before")  # 0.5 s: keeps the drain open
    ctx.running(1)
    server = ctx.sim.fleet.servers[0]
    drain = ctx.pool.submit(ctx.sim.run, lambda: server.drain(10.0))
    wait_until(lambda: server.availability.draining, what="draining")
    started = time.monotonic()
    result = {
        "health": ctx.client.get("/health").status_code,
        "health_at_once": time.monotonic() - started < 0.5,
        "ready": ctx.client.get("/ready").status_code,
        "generate": generate(ctx.client, [2], 2).status_code,
        "before": long.result().status_code,
    }
    result["drained"] = drain.result()
    return result


def repeated_prompt(ctx: Ctx) -> httpx.Response:
    generate(ctx.client, list(range(1, 41)), 2, rid="first").raise_for_status()
    return generate(ctx.client, list(range(1, 41)), 2, rid="again")


def retraction(ctx: Ctx) -> Any:
    first = ctx.later([1] * 10, 50, rid="a")  # 60 of 100 KV tokens
    ctx.running(1)
    second = generate(ctx.client, [2] * 10, 50, rid="b")  # does not fit beside it
    return [first.result().json()["meta_info"]["num_retractions"],
            second.json()["meta_info"]["num_retractions"]]


def queue_full(ctx: Ctx) -> httpx.Response:
    ctx.later([1], LONG, rid="q1")
    ctx.running(1)
    ctx.later([2], LONG, rid="q2")
    ctx.queued(1)
    response = generate(ctx.client, [3], 1)
    ctx.abort({"abort_all": True})
    return response


def seeds(ctx: Ctx) -> Any:
    def text(seed: int | None) -> str:
        params: dict[str, Any] = {"max_new_tokens": 8}
        if seed is not None:
            params["sampling_seed"] = seed
        return str(ctx.client.post("/generate", json={
            "input_ids": [3, 4], "sampling_params": params}).json()["text"])

    info = ctx.client.get("/server_info").json()
    return {"same_seed_same_text": text(1) == text(1), "seeds_differ": text(1) != text(2),
            "no_seed_repeats": text(None) == text(None),
            "honoured": info["enable_deterministic_inference"]}


THINK, END, NL, PARA = 248068, 248069, 198, 271  # Qwen3's <think>, </think>, "\n", "\n\n"
THINKING = {"thinking": True, "output_tokens_mean": 8, "context_length": 400}
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 18},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1},
    "ok": {"type": "boolean"}, "kind": {"$ref": "#/$defs/kind"}},
    "required": ["name", "age"], "$defs": {"kind": {"enum": ["x", "y"]}}}


def thought(prompt: list[int], budget: int = 200, require_reasoning: bool = False,
            **sampling: Any) -> Exchange:
    """A thinking answer, reduced to where its tags are (the words are tested elsewhere)."""
    def run(ctx: Ctx) -> Any:
        top = {"require_reasoning": True} if require_reasoning else {}
        body = ctx.client.post("/generate", json={
            "input_ids": prompt, "sampling_params": {"max_new_tokens": budget, **sampling},
            "rid": "t", **top}).json()
        ids, text = body["output_ids"], body["text"]
        return {"opens": ids[:2] == [THINK, NL],
                "ends_reasoning_at": ids.index(END) if END in ids else None,
                "text_opens": text.startswith("<think>\n"),
                "tags_in_text": ["<think>" in text, "</think>" in text],
                "reasoning_tokens": body["meta_info"]["reasoning_tokens"],
                "finish": body["meta_info"]["finish_reason"]["type"]}
    return run


def ended(budget_less: int = 0) -> Exchange:
    """A plain answer asked once with room, then with `budget_less` fewer tokens than it took:
    where its ids end, what they count, and whether the text holds the stop token."""
    def run(ctx: Ctx) -> Any:
        def ask(budget: int) -> dict[str, Any]:
            return ctx.sampled({"max_new_tokens": budget}).json()

        free = ask(80)
        body = ask(len(free["output_ids"]) - budget_less) if budget_less else free
        ids, info = body["output_ids"], body["meta_info"]
        return {"last_id": ids[-1], "counted": info["completion_tokens"] == len(ids),
                "words": len(body["text"].split()), "ids": len(ids),
                "eos_in_text": "<|im_end|>" in body["text"], "finish": info["finish_reason"]}
    return run


def structured(schema: Any, thinking: bool = False, **top: Any) -> Exchange:
    """Whether the answer (after any reasoning) is a document valid for the schema."""
    def run(ctx: Ctx) -> Any:
        response = ctx.client.post("/generate", json={
            "input_ids": [1, 2], "sampling_params": {
                "max_new_tokens": 90, "json_schema": json.dumps(schema),
                "skip_special_tokens": False}, **top})
        body = response.json()
        answer = body["text"].split("</think>")[-1].strip()
        jsonschema.validate(json.loads(answer), schema)
        return {"valid": True, "reasoned": "</think>" in body["text"],
                "finish": body["meta_info"]["finish_reason"]["type"]}
    return run


def grammar_held(prompt: list[int], **top: Any) -> Exchange:
    """Whether the answer to this prompt is a document for SCHEMA, and where its reasoning is."""
    def run(ctx: Ctx) -> Any:
        body = ctx.client.post("/generate", json={
            "input_ids": prompt, "sampling_params": {
                "max_new_tokens": 90, "json_schema": json.dumps(SCHEMA),
                "skip_special_tokens": False}, **top}).json()
        answer = body["text"].split("</think>")[-1].strip()
        try:
            jsonschema.validate(json.loads(answer), SCHEMA)
            document = True
        except (ValueError, jsonschema.ValidationError):
            document = False
        parser = ctx.client.get("/server_info").json()["reasoning_parser"]
        return {"document": document, "reasoned": "</think>" in body["text"],
                "reasoning_tokens": body["meta_info"]["reasoning_tokens"], "parser": parser}
    return run


def stopped(prompt: list[int], word: int, path: str = "/generate", **sampling: Any
            ) -> Exchange:
    """Ask once without a stop, then with the answer's `word`-th word (its leading space
    included) as the stop string: where the second answer ends and what it says."""
    def ask(ctx: Ctx, stop: list[str] | None) -> dict[str, Any]:
        extra = {} if stop is None else {"stop": stop}
        if path == "/generate":
            body = ctx.client.post(path, json={"input_ids": prompt, "sampling_params": {
                "max_new_tokens": 60, **sampling, **extra}}).json()
            return {"text": body["text"], "ids": body["output_ids"],
                    "finish": body["meta_info"]["finish_reason"],
                    "tokens": body["meta_info"]["completion_tokens"]}
        body = ctx.client.post(path, json={"prompt": prompt, "max_tokens": 60,
                                           "return_token_ids": True, **sampling,
                                           **extra}).json()
        choice = body["choices"][0]
        return {"text": choice["text"], "ids": choice["token_ids"],
                "finish": [choice["finish_reason"], choice["matched_stop"]],
                "tokens": body["usage"]["completion_tokens"]}

    def run(ctx: Ctx) -> Any:
        full = ask(ctx, None)
        text = full["text"].removeprefix("<think>\n")
        words = text.split(" ")
        stop = " " + words[word]
        # The first occurrence of the stop string ends the answer, at the token completing it.
        at = full["text"].index(stop)
        cut = ask(ctx, [stop, "never-said"])
        return {"finish": cut["finish"] == ({"type": "stop", "matched": stop}
                                            if path == "/generate" else ["stop", stop]),
                "trimmed": cut["text"] == full["text"][:at],
                "ids": cut["ids"] == full["ids"][:len(cut["ids"])],
                "through_the_stop": cut["ids"][-1] == full["ids"][len(cut["ids"]) - 1]
                and len(cut["ids"]) == cut["tokens"],
                "tags": ["<think>" in cut["text"], "</think>" in cut["text"]]}
    return run


def scored(ctx: Ctx) -> Any:
    """return_logprob + top_logprobs_num: the entries line up with the output ids."""
    body = ctx.client.post("/generate", json={
        "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 6}, "return_logprob": True,
        "top_logprobs_num": 3, "return_text_in_logprobs": True}).json()
    meta_info, ids = body["meta_info"], body["output_ids"]
    tokens = meta_info["output_token_logprobs"]
    tops = meta_info["output_top_logprobs"]
    return {
        "keys": [k for k in meta_info if "logprob" in k],
        "ids_match": [t[1] for t in tokens] == ids,
        "text_matches": "".join(t[2] for t in tokens) == body["text"],
        "length": meta_info["output_token_logprobs_length"],
        "top_k": sorted({len(row) for row in tops}),
        "chosen_is_best": all(row[0][:2] == t[:2] for row, t in zip(tops, tokens, strict=True)),
        "descending": all(row[i][0] >= row[i + 1][0] for row in tops for i in range(2)),
        "negative": all(t[0] < 0 for t in tokens),
        "inputs": [meta_info["input_token_logprobs"], meta_info["input_top_logprobs"]],
    }


def v1_scored(ctx: Ctx) -> Any:
    """SGLang's /v1 logprobs: tokens by text, no offsets, top dicts only for K > 0."""
    def choice(top: int) -> Any:
        return ctx.client.post("/v1/completions", json={
            "prompt": [1, 2], "max_tokens": 4, "logprobs": top,
            "return_token_ids": True}).json()["choices"][0]
    two, zero = choice(2), choice(0)
    logprobs = two["logprobs"]
    return {"offsets": set(logprobs["text_offset"]),
            "joined": "".join(logprobs["tokens"]) == two["text"],
            "ids": len(two["token_ids"]), "top": [len(row) for row in logprobs["top_logprobs"]],
            "zero_top": zero["logprobs"]["top_logprobs"],
            "same": zero["logprobs"]["token_logprobs"] == logprobs["token_logprobs"]}


CASES = [
    # -------- contract gate: {"error": "<string>"}
    Case("contract-unknown-sampling-key",
         "api/v1/api_types.py decode_SamplingParams/_unknown_field",
         lambda ctx: ctx.sampled({"max_new_tokens": 2, "seed": 5}),
         400, {"error": f"unknown field `seed`, expected one of {SAMPLING_FIELDS}"}),
    Case("contract-wrong-type", "api/v1/api_types.py decode_SamplingParams/_expect_int",
         lambda ctx: ctx.sampled({"max_new_tokens": "5"}),
         400, {"error": 'invalid type: string "5", expected i64'}),
    Case("contract-float-for-int", "api/v1/api_types.py _unexpected",
         lambda ctx: ctx.sampled({"top_k": 1.5}),
         400, {"error": "invalid type: floating point `1.5`, expected i64"}),
    Case("contract-bool-for-float", "api/v1/api_types.py _expect_float",
         lambda ctx: ctx.sampled({"temperature": True}),
         400, {"error": "invalid type: boolean `true`, expected f64"}),
    # -------- SamplingParams.verify: {"error": {"message": ...}}
    Case("verify-temperature", "srt/sampling/sampling_params.py SamplingParams.verify",
         lambda ctx: ctx.sampled({"max_new_tokens": 2, "temperature": -1}),
         400, message("temperature must be a non-negative finite number, got -1.")),
    Case("verify-top-k", "srt/sampling/sampling_params.py SamplingParams.verify",
         lambda ctx: ctx.sampled({"max_new_tokens": 2, "top_k": 0}),
         400, message("top_k must be -1 (disable) or at least 1, got 0.")),
    Case("verify-repetition-penalty", "srt/sampling/sampling_params.py SamplingParams.verify",
         lambda ctx: ctx.sampled({"max_new_tokens": 2, "repetition_penalty": 3}),
         400, message("repetition_penalty must be in (0, 2] (1.0 = no penalty), got 3.")),
    Case("verify-after-length-check",
         "srt/managers/tokenizer_manager.py _validate_one_request before verify",
         lambda ctx: ctx.sampled({"max_new_tokens": 2, "top_p": 5}, [1] * CONTEXT),
         400, message("The input (100 tokens) is longer than the model's context length "
                      "(100 tokens).")),
    # -------- context rules
    Case("context-input-too-long", "srt/managers/tokenizer_manager.py _validate_one_request",
         lambda ctx: generate(ctx.client, [1] * CONTEXT, 0),
         400, message("The input (100 tokens) is longer than the model's context length "
                      "(100 tokens).")),
    Case("context-total-too-long", "srt/managers/tokenizer_manager.py _validate_one_request",
         lambda ctx: generate(ctx.client, [1] * 50, 51),
         400, message(
             "Requested token count exceeds the model's maximum context length of 100 tokens. "
             "You requested a total of 101 tokens: 50 tokens from the input messages and 51 "
             "tokens for the completion. Please reduce the number of tokens in the input "
             "messages or the completion to fit within the limit.")),
    Case("context-total-skipped-without-max-new-tokens",
         "srt/managers/tokenizer_manager.py _validate_one_request (max_new_tokens is None)",
         lambda ctx: ctx.client.post("/generate", json={"input_ids": [1] * 50, "rid": "d"}),
         200, answer("d", length(48), 50, 48), {"output_tokens_mean": ENDLESS}),
    Case("speculative-reserve-counts-in-checks",
         "srt/managers/utils.py compute_num_reserved_tokens",
         lambda ctx: generate(ctx.client, [1] * 50, 47),
         400, message(
             "Requested token count exceeds the model's maximum context length of 100 tokens. "
             "You requested a total of 101 tokens: 54 tokens from the input messages and 47 "
             "tokens for the completion. Please reduce the number of tokens in the input "
             "messages or the completion to fit within the limit."),
         {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
          "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}),
    Case("speculative-reserve-not-in-prompt-tokens",
         "srt/managers/tokenizer_manager.py _validate_one_request (reserve in checks only)",
         lambda ctx: generate(ctx.client, [1] * 10, 5, rid="s"),
         200, spec_answer("s", length(5), 10, 5), {"speculative_algorithm": "EAGLE"}),
    Case("speculative-meta-info",
         "srt/managers/tokenizer_manager.py _calculate_spec_decoding_metrics",
         lambda ctx: generate(ctx.client, [1] * 10, 40, rid="d"),
         200, spec_answer("d", length(40), 10, 40),
         {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16,
          "spec_accept_rate": 0.5, "output_tokens_mean": ENDLESS}),
    Case("speculative-one-token-answer-has-no-spec-fields",
         "srt/managers/tokenizer_manager.py _calculate_spec_decoding_metrics (verify_ct 0)",
         lambda ctx: generate(ctx.client, [1] * 10, 1, rid="o"),
         200, answer("o", length(1), 10, 1), {"speculative_algorithm": "EAGLE3"}),
    Case("scheduler-input-length", "srt/managers/utils.py validate_input_length",
         lambda ctx: generate(ctx.client, [1] * 94, 1),
         400, message("Input length (94 tokens) exceeds the maximum allowed length (94 tokens)."
                      " Use a shorter input or enable --allow-auto-truncate.")),
    Case("scheduler-silent-clamp", "srt/managers/scheduler.py init_req_max_new_tokens",
         lambda ctx: generate(ctx.client, [1] * 50, 50, rid="c"),
         200, answer("c", length(48), 50, 48), {"output_tokens_mean": ENDLESS}),
    Case("kv-memory-clamp",
         "srt/mem_cache/allocator/base.py max_new_tokens_for_memory (page-rounded input)",
         lambda ctx: generate(ctx.client, [1] * 100, 90, rid="k"),
         200, answer("k", length(71), 100, 71),
         {"context_length": 1000, "max_total_tokens": 200, "page_size": 16,
          "output_tokens_mean": ENDLESS}),
    # -------- rids
    Case("duplicate-rid-in-flight", "srt/managers/tokenizer_manager.py _init_req_state",
         duplicate_rid, 400, message("Duplicate request ID detected: dup"), SLOW),
    Case("duplicate-rid-in-batch",
         "srt/managers/io_struct.py GenerateReqInput._validate_rid_uniqueness",
         batch(["a", "a"]), 400,
         message("Duplicate request IDs detected within the request: ['a']")),
    Case("batch-rid-prefix", "srt/managers/io_struct.py GenerateReqInput._normalize_rid",
         batch("row"), 200,
         [answer("row_0", length(3), 2, 3), answer("row_1", length(3), 2, 3)],
         {"output_tokens_mean": ENDLESS}),
    # -------- aborts: HTTP 200
    Case("abort-running", "srt/managers/schedule_batch.py FINISH_ABORT.to_json; "
         "tokenizer_manager.py _handle_abort_finish_reason (no status_code: 200)",
         abort_running, 200, None, {**SLOW, "max_running_requests": 1}),
    Case("abort-waiting", "srt/managers/tokenizer_manager.py _handle_abort_req",
         abort_waiting, 200, {
             "text": "", "output_ids": "<0 ids>", "meta_info": {
                 "id": "second",
                 "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
                 "weight_version": "default", "e2e_latency": "<seconds>",
                 "weight_versions": [{"version": "default", "start": 0, "end": 0}],
                 "completion_tokens": 0}},
         {**SLOW, "max_running_requests": 1}),
    Case("abort-by-rid-prefix", "srt/managers/scheduler.py Scheduler.abort_request "
         "(req.rid.startswith)", abort_prefix, None, [ABORTED, ABORTED], SLOW),
    Case("abort-needs-exact-rid", "srt/managers/tokenizer_manager.py "
         "TokenizerManager.abort_request (rid_to_state lookup, empty rid)",
         abort_prefix_without_exact, None, length(10), SLOW),
    Case("abort-all", "srt/managers/scheduler.py Scheduler.abort_request (abort_all)",
         abort_all, None, [ABORTED, ABORTED], SLOW),
    # -------- info
    Case("server-info-cli-default", "srt/entrypoints/http_server.py server_info; "
         "scheduler_components/internal_state.py _add_topology", info("/server_info", *INFO_KEYS),
         None, {"max_running_requests": None, "max_req_input_len": 94,
                "max_total_num_tokens": 6400, "context_length": CONTEXT,
                "speculative_algorithm": None, "speculative_num_draft_tokens": None,
                "enable_deterministic_inference": False, "skip_tokenizer_init": False,
                "version": "0.5.23", "dp_ranks": 1, "per_dp": [64]}),
    Case("get-server-info-passed-slots", "srt/entrypoints/http_server.py get_server_info",
         info("/get_server_info", "max_running_requests"), None,
         {"max_running_requests": 8, "dp_ranks": 2, "per_dp": [4, 4]},
         {"max_running_requests": 8, "dp_size": 2}),
    Case("server-info-speculative", "srt/arg_groups/speculative_hook.py _handle_eagle_family",
         info("/server_info", "max_running_requests", "speculative_algorithm",
              "speculative_num_draft_tokens", "max_req_input_len"), None,
         {"max_running_requests": 48, "speculative_algorithm": "EAGLE",
          "speculative_num_draft_tokens": 4, "max_req_input_len": 94, "dp_ranks": 1,
          "per_dp": [48]}, {"speculative_algorithm": "EAGLE"}),
    Case("server-info-derived-slots-only-internal",
         "srt/managers/scheduler_components/internal_state.py _add_topology",
         info("/server_info", "max_running_requests"), None,
         {"max_running_requests": None, "dp_ranks": 1, "per_dp": [12]}, {"derived_slots": 12}),
    # -------- lifecycle
    Case("ready-instant-health-slow", "srt/entrypoints/http_server.py ready, health_generate",
         health_timing, None,
         {"ready": 200, "ready_fast": True, "health": 200, "health_at_least_1s": True},
         {"health_delay_s": 1.0}),
    Case("drain-accepts-work", "srt/managers/tokenizer_manager.py SignalHandler."
         "sigterm_handler, sigterm_watchdog", draining, None,
         {"health": 503, "health_at_once": True, "ready": 503, "generate": 200,
          "before": 200, "drained": True}, {"tpot_ms": 20.0, "output_tokens_mean": ENDLESS,
                                            "health_delay_s": 1.0}),
    # -------- answers
    Case("skip-tokenizer-init", "srt/managers/tokenizer_manager.py _handle_batch_output "
         "(BatchTokenIDOutput)", lambda ctx: generate(ctx.client, [1, 2], 3, rid="t"), 200,
         {"output_ids": "<3 ids>", "meta_info": meta("t", length(3), 2, 3)},
         {"skip_tokenizer_init": True, "output_tokens_mean": ENDLESS}),
    Case("cached-tokens-on-repeat", "srt/managers/scheduler_components/output_streamer.py "
         "get_cached_tokens_details", repeated_prompt, 200,
         answer("again", length(2), 40, 2, cached=39), {"output_tokens_mean": ENDLESS}),
    Case("retraction-is-latency", "srt/managers/schedule_batch.py Req.retraction_count "
         "(meta_info.num_retractions)", retraction, None, [0, 1],
         {**SLOW, "max_total_tokens": 100, "tpot_ms": 10.0}),
    Case("sampling-seed", "srt/sampling/sampling_batch_info.py (sampling_seed needs "
         "--enable-deterministic-inference)", seeds, None,
         {"same_seed_same_text": True, "seeds_differ": True, "no_seed_repeats": True,
          "honoured": True}, {"enable_deterministic_inference": True}),
    Case("queue-full", "srt/managers/tokenizer_manager.py (max_queued_requests)",
         queue_full, 503, {"object": "error", "message": "The request queue is full.",
                           "type": "503", "param": None, "code": 503},
         {**SLOW, "max_running_requests": 1, "max_queued_requests": 1}),
    # -------- a thinking model (a reasoning parser on the server)
    Case("thinking-tags-kept", "srt/managers/detokenizer_manager.py (skip_special_tokens "
         "false); batch_result_processor.py _maybe_update_reasoning_tokens (counts only with "
         "require_reasoning: the qwen3 parser has no self_opened_think_start_ids)",
         thought([1, 2], skip_special_tokens=False), None,
         {"opens": True, "ends_reasoning_at": 18, "text_opens": True,
          "tags_in_text": [True, True], "reasoning_tokens": 0, "finish": "stop"}, THINKING),
    Case("thinking-tags-in-text-by-default", "srt/sampling/sampling_params.py "
         "(skip_special_tokens defaults to true); Qwen3.6's tokenizer marks <think> and "
         "</think> special: false, so skipping special tokens keeps them",
         thought([1, 2]), None,
         {"opens": True, "ends_reasoning_at": 18, "text_opens": True,
          "tags_in_text": [True, True], "reasoning_tokens": 0, "finish": "stop"}, THINKING),
    Case("thinking-reasoning-tokens-required", "batch_result_processor.py "
         "_maybe_update_reasoning_tokens; schedule_batch.py Req.update_reasoning_tokens "
         "(require_reasoning: every token up to and including </think>)",
         thought([1, 2], require_reasoning=True), None,
         {"opens": True, "ends_reasoning_at": 18, "text_opens": True,
          "tags_in_text": [True, True], "reasoning_tokens": 19, "finish": "stop"}, THINKING),
    Case("thinking-off-by-empty-block", "Qwen3 chat template enable_thinking=false",
         thought([1, 2, THINK, PARA, END, PARA], skip_special_tokens=False), None,
         {"opens": False, "ends_reasoning_at": None, "text_opens": False,
          "tags_in_text": [False, False], "reasoning_tokens": 0, "finish": "stop"}, THINKING),
    Case("thinking-inside-open-block", "schedule_batch.py Req.update_self_opened_reasoning_"
         "tokens (no <think> of its own: not counted)",
         thought([1, 2, THINK, NL], skip_special_tokens=False), None,
         {"opens": False, "ends_reasoning_at": 11, "text_opens": False,
          "tags_in_text": [False, True], "reasoning_tokens": 0, "finish": "stop"}, THINKING),
    Case("thinking-budget-ends-in-reasoning", "scheduler.py (finish length, no </think>)",
         thought([1, 2], 5, skip_special_tokens=False), None,
         {"opens": True, "ends_reasoning_at": None, "text_opens": True,
          "tags_in_text": [True, False], "reasoning_tokens": 0, "finish": "length"}, THINKING),
    # -------- the stop token
    Case("eos-ends-the-output", "schedule_batch.py Req.output_ids_through_stop ('Stop position "
         "is included'), _check_token_based_finish (finished_len = matched_pos + 1); "
         "detokenizer_manager.py trim_matched_stop (the text without it)",
         ended(), None, {"last_id": 248046, "counted": True, "words": 3, "ids": 4,
                         "eos_in_text": False, "finish": {"type": "stop", "matched": 248046}},
         {"output_tokens_mean": 8}),
    Case("eos-fits-as-the-last-budgeted-token", "schedule_batch.py update_finish_state (the "
         "stop token is checked before the length cap)",
         ended(0), None, {"last_id": 248046, "counted": True, "words": 3, "ids": 4,
                          "eos_in_text": False,
                          "finish": {"type": "stop", "matched": 248046}},
         {"output_tokens_mean": 8}),
    Case("eos-cut-by-the-budget", "schedule_batch.py update_finish_state (FINISH_LENGTH one "
         "token short of the stop token)",
         ended(1), None, {"last_id": 1179, "counted": True, "words": 3, "ids": 3,
                          "eos_in_text": False, "finish": length(3)}, {"output_tokens_mean": 8}),
    # -------- structured output
    Case("json-schema-document", "constrained/xgrammar_backend.py dispatch_json",
         structured(SCHEMA), None, {"valid": True, "reasoned": False, "finish": "stop"}),
    Case("json-schema-grammar-from-first-token", "constrained/grammar_manager.py "
         "process_req_with_grammar (require_reasoning false)", structured(SCHEMA), None,
         {"valid": True, "reasoned": False, "finish": "stop"}, THINKING),
    Case("json-schema-after-reasoning", "constrained/reasoner_grammar_backend.py "
         "ReasonerGrammarObject.maybe_init_reasoning (require_reasoning)",
         structured(SCHEMA, require_reasoning=True), None,
         {"valid": True, "reasoned": True, "finish": "stop"}, THINKING),
    Case("json-schema-waits-on-a-closed-block", "constrained/reasoner_grammar_backend.py "
         "ReasonerGrammarObject.maybe_init_reasoning (require_reasoning on a prompt that closed "
         "the think block: the </think> it waits for never comes, the grammar never applies; "
         "Req.update_reasoning_tokens counts every token as reasoning, the stop token too)",
         grammar_held([1, 2, THINK, PARA, END, PARA], require_reasoning=True), None,
         {"document": False, "reasoned": False, "reasoning_tokens": 10, "parser": "qwen3"},
         THINKING),
    Case("json-schema-closed-block-from-first-token", "constrained/grammar_manager.py "
         "process_req_with_grammar (require_reasoning false)",
         grammar_held([1, 2, THINK, PARA, END, PARA]), None,
         {"document": True, "reasoned": False, "reasoning_tokens": 0, "parser": "qwen3"},
         THINKING),
    Case("json-schema-no-reasoning-parser", "constrained/base_grammar_backend.py "
         "create_grammar_backend (no ReasonerGrammarBackend without --reasoning-parser; "
         "BaseGrammarObject.maybe_init_reasoning does nothing); configs/model_config.py "
         "think_end_ids (None without a parser: no reasoning_tokens)",
         grammar_held([1, 2, THINK, NL], require_reasoning=True), None,
         {"document": True, "reasoned": False, "reasoning_tokens": 0, "parser": None},
         {**THINKING, "no_reasoning_parser": True}),
    Case("json-schema-open-block-after-reasoning", "ReasonerGrammarObject.maybe_init_reasoning "
         "(require_reasoning, a parser, a prompt that opened the block)",
         grammar_held([1, 2, THINK, NL], require_reasoning=True), None,
         {"document": True, "reasoned": True, "reasoning_tokens": 12, "parser": "qwen3"},
         THINKING),
    Case("json-schema-not-json", "constrained/grammar_manager.py get_ready_grammar_requests; "
         "tokenizer_manager.py _handle_abort_finish_reason (400: ValueError)",
         lambda ctx: ctx.sampled({"max_new_tokens": 4, "json_schema": "{nope"}), 400,
         message("Failed to compile json grammar: Expecting property name enclosed in double "
                 "quotes: line 1 column 2 (char 1)")),
    Case("json-schema-ignored-keyword", "constrained/json_schema_validation.py "
         "validate_xgrammar_json_schema", lambda ctx: ctx.sampled({
             "max_new_tokens": 4, "json_schema": json.dumps(
                 {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}})}),
         400, message("Failed to compile json grammar: JSON Schema at #/properties/a is not "
                      "supported by xgrammar: keyword(s) multipleOf would be ignored")),
    Case("json-schema-string-constraints", "constrained/json_schema_validation.py "
         "validate_xgrammar_json_schema (string constraint groups)", lambda ctx: ctx.sampled({
             "max_new_tokens": 4, "json_schema": json.dumps(
                 {"type": "string", "format": "email", "maxLength": 9})}),
         400, message("Failed to compile json grammar: JSON Schema at # is not supported by "
                      "xgrammar: constraints format, minLength/maxLength cannot be enforced "
                      "together")),
    Case("json-schema-is-a-string", "api/v1/api_types.py decode_SamplingParams (json_schema: "
         "str)", lambda ctx: ctx.sampled({"json_schema": {"type": "object"}}), 400,
         {"error": "invalid type: map, expected a string"}),
    # -------- stop strings
    Case("stop-string", "managers/schedule_batch.py Req._check_str_based_finish, "
         "_locate_str_stop_finished_len, FINISH_MATCHED_STR.to_json; "
         "managers/detokenizer_manager.py trim_matched_stop (output[:pos])",
         stopped([1, 2], 4), None,
         {"finish": True, "trimmed": True, "ids": True, "through_the_stop": True,
          "tags": [False, False]}, {"output_tokens_mean": ENDLESS}),
    Case("stop-string-inside-reasoning", "Req._check_str_based_finish (the tail is decoded "
         "with special tokens, inside the reasoning too: no </think>)",
         stopped([1, 2, THINK, NL], 3, skip_special_tokens=False), None,
         {"finish": True, "trimmed": True, "ids": True, "through_the_stop": True,
          "tags": [False, False]}, {**THINKING, "output_tokens_mean": 40}),
    Case("stop-string-v1", "entrypoints/openai/serving_completions.py "
         "(finish_reason type, matched_stop = meta_info finish_reason matched)",
         stopped([1, 2], 5, "/v1/completions"), None,
         {"finish": True, "trimmed": True, "ids": True, "through_the_stop": True,
          "tags": [False, False]}, {"output_tokens_mean": ENDLESS}),
    Case("stop-string-no-trim", "detokenizer_manager.py trim_matched_stop (no_stop_trim: "
         "output[:end])", lambda ctx: [ctx.client.post("/generate", json={
             "input_ids": [1, 2], "sampling_params": {
                 "max_new_tokens": 40, "stop": w, "no_stop_trim": True}}).json()["text"]
             .endswith(w) for w in (" " + ctx.client.post("/generate", json={
                 "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 40}})
                 .json()["text"].split(" ")[6],)], None, [True],
         {"output_tokens_mean": ENDLESS}),
    Case("stop-strings-at-most-32", "sampling/sampling_params.py SamplingParams.normalize "
         "(MAX_STOP_COUNT)", lambda ctx: ctx.sampled({"max_new_tokens": 4,
                                                      "stop": [f"s{i}" for i in range(33)]}),
         400, message("at most 32 stop strings are allowed, got 33")),
    # -------- log-probabilities
    Case("logprobs-meta-info", "srt/managers/tokenizer_manager.py add_logprob_to_meta_info, "
         "detokenize_logprob_tokens, detokenize_top_logprobs_tokens", scored, None,
         {"keys": ["input_token_logprobs", "output_token_logprobs",
                   "output_token_logprobs_length", "input_top_logprobs", "output_top_logprobs"],
          "ids_match": True, "text_matches": True, "length": 6, "top_k": [3],
          "chosen_is_best": True, "descending": True, "negative": True, "inputs": [[], []]},
         {"output_tokens_mean": ENDLESS}),
    Case("v1-logprobs-by-text", "srt/entrypoints/openai/utils.py to_openai_style_logprobs; "
         "serving_completions.py (return_token_ids)", v1_scored, None,
         {"offsets": {-1}, "joined": True, "ids": 4, "top": [2, 2, 2, 2], "zero_top": [],
          "same": True}, {"output_tokens_mean": ENDLESS}),
    Case("logprobs-contract", "api/v1/api_types.py decode_Int64OrList",
         lambda ctx: generate(ctx.client, [1], 2, return_logprob=True, top_logprobs_num="2"),
         400, {"error": 'invalid type: string "2", expected a value or an array of values for '
                        "Int64OrList"}),
    Case("auth", "srt/entrypoints/http_server.py api key middleware (health/ready exempt)",
         lambda ctx: [ctx.client.post("/generate", json={"input_ids": [1]}).json(),
                      ctx.client.get("/ready").status_code,
                      ctx.client.get("/health").status_code],
         None, [{"error": "Unauthorized"}, 200, 200], {"api_key": "k"}),
]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=6) as executor:
        yield executor


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_conformance(case: Case, start_sim: StartSim, pool: ThreadPoolExecutor) -> None:
    assert case.source, "every row names the SGLang function it follows"
    sim = start_sim(**{"context_length": CONTEXT, **case.config})
    with httpx.Client(base_url=sim.url, timeout=15) as client:
        result = case.exchange(Ctx(client, pool, sim))
    if case.status is None:
        assert normalize(result) == case.body
        return
    assert isinstance(result, httpx.Response)
    assert result.status_code == case.status, result.text
    if case.id == "abort-running":
        body = normalize(result.json())
        tokens = result.json()["meta_info"]["completion_tokens"]
        assert 0 < tokens < LONG
        assert body == answer("long", ABORTED, 3, tokens)
        return
    assert normalize(result.json()) == case.body
