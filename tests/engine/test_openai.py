"""The OpenAI-protocol engine: each engine's length rule, the parsing of each engine's
context-length 400, the answer shape, and protocol detection over real HTTP."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import httpx
import pytest

from fleetgen import engine, errors
from fleetgen.engine import openai
from fleetgen.engine.api import ServerLimits
from fleetgen.engine.detect import detect
from fleetgen.errors import ConfigError
from tests.support.httpd import serving
from tests.support.sim import StartSim

VLLM_LONG = ("This model's maximum context length is 4096 tokens. However, your prompt contains "
             "5000 input tokens, which exceeds this limit even without any output tokens. "
             "Please reduce the length of the input prompt.")
VLLM_OLD = ("This model's maximum context length is 4096 tokens. However, you requested 4200 "
            "tokens (4000 in the messages, 200 in the completion). Please reduce the length of "
            "the messages or completion.")
VLLM_EQUAL = ("The decoder prompt (length 4096) plus the number of requested output tokens (at "
              "least 1) is longer than the maximum model length of 4096. Make sure that ...")
LLAMA = {"error": {"code": 400, "message": "request (5000 tokens) exceeds the available context "
                   "size (4096 tokens), try increasing it", "type": "exceed_context_size_error",
                   "n_prompt_tokens": 5000, "n_ctx": 4096}}


def error_for(body: object) -> errors.EngineError:
    return openai.from_response(httpx.Response(400, json=body))


@pytest.mark.parametrize(("body", "prompt", "context"), [
    ({"error": {"message": VLLM_LONG, "type": "BadRequestError", "code": 400}}, 5000, None),
    ({"object": "error", "message": VLLM_OLD, "type": "BadRequestError", "code": 400}, 4000, 4096),
    ({"error": {"message": VLLM_EQUAL, "type": "BadRequestError", "code": 400}}, 4096, None),
    (LLAMA, 5000, None),
    ({"error": {**LLAMA["error"], "n_prompt_tokens": 3000}}, 3000, 4096),
])
def test_each_engines_context_400_is_read_with_its_counts(body: object, prompt: int,
                                                         context: int | None) -> None:
    err = error_for(body)
    assert isinstance(err, errors.ContextLengthError)
    assert (err.server_prompt_tokens, err.context_length) == (prompt, context)


def test_other_400s_are_permanent_and_5xx_retryable() -> None:
    assert type(error_for({"error": {"message": "bad temperature"}})) is errors.PermanentError
    assert isinstance(openai.from_response(httpx.Response(503, json={})), errors.RetryableError)


def test_the_rules_of_vllm_and_llama_cpp_leave_context_minus_prompt() -> None:
    limits = ServerLimits(context_length=4096, engine=openai.VLLM)
    rule = openai.PROTOCOL.rule_for(limits)
    assert (rule.input_limit(limits), rule.room(100, limits)) == (4096, 3996)
    llama = ServerLimits(context_length=4096, engine=openai.LLAMA_CPP)
    assert openai.PROTOCOL.rule_for(llama).room(4095, llama) == 1
    sglang = ServerLimits(context_length=4096, engine=openai.SGLANG)  # SGLang's own /v1
    assert openai.PROTOCOL.rule_for(sglang).room(100, sglang) == 4096 - 100 - 2
    err = errors.ContextLengthError("m", 400, 4000, 4096)
    assert rule.correction(err, 200) == 96 and rule.correction(err, 50) is None


@pytest.mark.parametrize(("choice", "kind"), [
    ({"text": "hi", "finish_reason": "stop"}, None),
    ({"text": "hi", "finish_reason": "abort"}, errors.AbortedError),
    ({"text": "hi", "finish_reason": None}, errors.AbortedError),
])
def test_only_stop_and_length_are_answers(choice: dict[str, object],
                                          kind: type[Exception] | None) -> None:
    data = {"choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    if kind is None:
        assert openai.parse_completion(data).text == "hi"
    else:
        with pytest.raises(kind):
            openai.parse_completion(data)


def test_detection_over_http(start_sim: StartSim) -> None:
    sglang = start_sim(context_length=4096)
    vllm = start_sim(context_length=2048, flavor="vllm")
    assert detect(sglang.url).protocol == "sglang"
    found = detect(vllm.url)
    assert (found.protocol, found.engine) == ("openai", "vllm"), found
    assert engine.resolve(None, vllm.url).name == "openai"
    with pytest.raises(ConfigError, match="does not speak SGLang's native protocol"):
        engine.resolve("sglang", vllm.url)
    with pytest.raises(ConfigError, match="unknown engine protocol 'bogus'"):
        engine.resolve("bogus", vllm.url)
    limits = openai.PROTOCOL.read_limits(vllm.url)
    assert (limits.context_length, limits.engine) == (2048, "vllm")


def test_the_client_generates_with_token_ids_and_a_budget_the_rule_allows(
        start_sim: StartSim) -> None:
    vllm = start_sim(context_length=64, flavor="vllm", output_tokens_mean=10_000)
    client = openai.PROTOCOL.connect(vllm.url, timeout_s=10, concurrency=1)
    try:
        limits = openai.PROTOCOL.read_limits(vllm.url)
        room = client.rule.room(10, limits)
        gen = client.generate(list(range(1, 11)), room, {"seed": 3}, rid="r:1:ab")
        assert (gen.prompt_tokens, gen.completion_tokens, gen.finish_reason) == (10, 54, "length")
        with pytest.raises(errors.ContextLengthError) as info:
            client.generate(list(range(1, 65)), 1, {}, rid="r:2:ab")
        assert info.value.server_prompt_tokens == 64
        assert client.healthy()
    finally:
        client.close()


def test_sglangs_own_v1_is_budgeted_with_its_speculative_reserve(start_sim: StartSim) -> None:
    """The OpenAI protocol on SGLang's /v1 reads /server_info as the native one does: EAGLE
    with topk 2 x 4 steps, 6 drafts reserves 8 tokens (`compute_num_reserved_tokens`), and
    SGLang's /v1 checks them (`_validate_one_request`), so a budget without them is a 400."""
    sim = start_sim(context_length=4096, max_running_requests=6, speculative_algorithm="EAGLE",
                    speculative_num_steps=4, speculative_eagle_topk=2,
                    speculative_num_draft_tokens=6)
    limits = openai.PROTOCOL.read_limits(sim.url)
    assert (limits.engine, limits.reserved_tokens, limits.context_length) == ("sglang", 8, 4096)
    assert openai.PROTOCOL.pool_size(limits) == 7  # K + 1, as the native protocol sizes it
    client = openai.PROTOCOL.connect(sim.url, timeout_s=30, concurrency=1)
    try:
        room = client.rule.room(100, limits)
        assert room == 4096 - 8 - 100 - 1
        gen = client.generate(list(range(1, 101)), room, {}, rid="spec:1:ab")
        assert gen.prompt_tokens == 100
        with pytest.raises(errors.ContextLengthError):  # what the old limits (no reserve) gave
            client.generate(list(range(1, 101)), 4096 - 100 - 2, {}, rid="spec:2:ab")
    finally:
        client.close()


class LlamaLike(BaseHTTPRequestHandler):
    """What a llama.cpp server answers, as far as the client looks: `/props` (so it is detected
    as llama.cpp), `/v1/models`, and `/v1/completions`, whose bodies it keeps."""

    bodies: ClassVar[list[dict[str, object]]] = []

    def do_GET(self) -> None:
        if self.path == "/props":
            self._send({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2})
        elif self.path == "/v1/models":
            self._send({"object": "list", "data": [{"id": "tiny", "object": "model",
                                                    "owned_by": "llamacpp"}]})
        else:
            self._send({"status": "ok"})

    def do_POST(self) -> None:
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self._send({"choices": [{"text": "a b", "index": 0, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2}})

    def _send(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_llama_cpp_says_where_its_slot_count_comes_from() -> None:
    """The limit's source on the terminal names the field read ("llama.cpp reports 2 running
    requests (/props total_slots)"); it said "(None)" for llama.cpp."""
    with serving(LlamaLike) as url:
        limits = openai.llama_cpp_limits(url)
    assert (limits.max_running_requests, limits.running_requests_from) == (
        2, "/props total_slots")


def test_llama_cpp_gets_its_own_name_for_the_repetition_penalty() -> None:
    """llama.cpp reads `repeat_penalty` (server-schema.cpp `make_llama_cmpl_schema`) and drops
    what its schema lacks: the client that detected llama.cpp renames it; vLLM and SGLang keep
    `repetition_penalty`."""
    sampling = {"repetition_penalty": 1.15, "temperature": 0.5}
    with serving(LlamaLike) as url:
        client = openai.PROTOCOL.connect(url, timeout_s=5, concurrency=1)
        try:
            client.generate([1, 2, 3], 8, dict(sampling), "run:1:ab")
        finally:
            client.close()
    sent = LlamaLike.bodies[-1]
    assert sent["repeat_penalty"] == 1.15 and "repetition_penalty" not in sent
    assert sent["temperature"] == 0.5
    for flavor in (openai.VLLM, openai.SGLANG):
        body = openai.completion_body([1], 8, dict(sampling), None, engine=flavor)
        assert body["repetition_penalty"] == 1.15 and "repeat_penalty" not in body


def test_latency_is_the_requests_wall_time(start_sim: StartSim) -> None:
    # The OpenAI answer has no timing of its own: the client measures the request (it wrote
    # a constant 0.0 before). 40 ms to the first token, 5 ms per token, 8 tokens: >= 75 ms.
    vllm = start_sim(context_length=256, flavor="vllm", ttft_ms=40.0, tpot_ms=5.0,
                     output_tokens_mean=10_000)
    client = openai.PROTOCOL.connect(vllm.url, timeout_s=10, concurrency=1)
    try:
        gen = client.generate(list(range(1, 11)), 8, {}, rid="r:3:ab")
    finally:
        client.close()
    assert gen.completion_tokens == 8
    assert 0.075 <= gen.latency_s < 5, gen.latency_s


VLLM_NO_ROOM = "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
VLLM_OVER = ("max_tokens=5000 cannot be greater than max_model_len=4096. Please request fewer "
             "output tokens. (parameter=max_tokens, value=5000)")


def test_vllm_032s_budget_refusals_are_context_errors_with_the_prompt_sent() -> None:
    # As the real vLLM 0.32.0 answered (tests/real_engines/test_vllm.py): a prompt of the
    # whole context is clamped to a budget of 0 and refused; a budget over the context is
    # refused whatever the prompt. Both name no prompt count: it is the ids sent.
    rule = openai.RULES[openai.VLLM]
    body = {"error": {"message": VLLM_NO_ROOM, "type": "BadRequestError",
                      "param": "max_tokens", "code": 400}}
    full = openai.from_response(httpx.Response(400, json=body), 4096)
    assert isinstance(full, errors.ContextLengthError)
    assert (full.server_prompt_tokens, full.context_length) == (4096, None)
    assert rule.correction(full, 1) is None
    over = openai.from_response(httpx.Response(400, json={"error": {"message": VLLM_OVER}}), 100)
    assert isinstance(over, errors.ContextLengthError)
    assert (over.server_prompt_tokens, over.context_length) == (100, 4096)
    assert rule.correction(over, 5000) == 3996
