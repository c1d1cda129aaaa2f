"""`--flavor vllm`: the simulator's /v1/completions answers as vLLM 0.32.0 does (its length rule
and error body, as the real server answered them: tests/real_engines/test_vllm.py), and the
SGLang-only endpoints are not there."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest

from tests.support.sim import StartSim

CONTEXT = 64


@pytest.fixture
def client(start_sim: StartSim) -> httpx.Client:
    sim = start_sim(flavor="vllm", context_length=CONTEXT, output_tokens_mean=10_000)
    return httpx.Client(base_url=sim.url, timeout=10)


def complete(client: httpx.Client, prompt_tokens: int, max_tokens: int) -> httpx.Response:
    return client.post("/v1/completions", json={
        "model": "m", "prompt": list(range(1, prompt_tokens + 1)), "max_tokens": max_tokens,
        "ignore_eos": True})


def test_max_tokens_past_the_room_is_clamped_not_refused(client: httpx.Client) -> None:
    # api_utils.py `get_max_tokens`: min(max_tokens, max_model_len - input)
    response = complete(client, 50, CONTEXT - 4)
    assert response.status_code == 200
    body = response.json()
    assert body["usage"]["completion_tokens"] == CONTEXT - 50
    assert body["usage"]["prompt_tokens"] == 50
    assert body["choices"][0]["finish_reason"] == "length"


def refusal(response: httpx.Response) -> tuple[str, str]:
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    return error["param"], error["message"]


def test_max_tokens_over_the_context_is_refused(client: httpx.Client) -> None:
    # renderers/params.py `TokenizeParams.__post_init__`, whatever the prompt
    assert refusal(complete(client, 5, CONTEXT + 1)) == ("max_tokens", (
        f"max_tokens={CONTEXT + 1} cannot be greater than max_model_len={CONTEXT}. Please "
        f"request fewer output tokens. (parameter=max_tokens, value={CONTEXT + 1})"))


def test_a_prompt_of_the_whole_context_leaves_a_budget_of_0(client: httpx.Client) -> None:
    # `get_max_tokens` clamps to 0, then `SamplingParams._verify_args` refuses it: vLLM 0.32
    # answers so before its own prompt-length check (seen on the real server)
    expected = ("max_tokens", "max_tokens must be at least 1, got 0. (parameter=max_tokens, "
                "value=0)")
    assert refusal(complete(client, CONTEXT, 1)) == expected
    assert refusal(complete(client, 5, 0)) == expected


def test_a_longer_prompt_is_refused_with_its_count(client: httpx.Client) -> None:
    # renderers/params.py `_token_len_check`: "at least" when one over
    for over, qualifier in ((5, ""), (1, "at least ")):
        assert refusal(complete(client, CONTEXT + over, 1)) == ("input_tokens", (
            f"This model's maximum context length is {CONTEXT} tokens. However, your prompt "
            f"contains {qualifier}{CONTEXT + over} input tokens, which exceeds this limit "
            "even without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={CONTEXT + over})"))


def test_only_the_openai_endpoints_and_an_instant_health(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()["data"][0]
    assert (models["owned_by"], models["max_model_len"]) == ("vllm", CONTEXT)
    assert client.get("/health").status_code == 200
    for path in ("/ready", "/server_info", "/get_server_info"):
        assert client.get(path).status_code == 404, path
    assert client.post("/generate", json={"input_ids": [1]}).status_code in (404, 405)


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}},
          "required": ["n"]}


def test_structured_outputs_json_string_or_object_and_its_refusal(start_sim: StartSim) -> None:
    # sampling_params.py StructuredOutputsParams.json (str | dict); `auto` backend:
    # a string that is not JSON is "Invalid JSON grammar specification."
    sim = start_sim(flavor="vllm", context_length=256)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        for schema in (json.dumps(SCHEMA), SCHEMA):
            body = client.post("/v1/completions", json={
                "prompt": [1, 2], "max_tokens": 100,
                "structured_outputs": {"json": schema}}).json()
            jsonschema.validate(json.loads(body["choices"][0]["text"]), SCHEMA)
        wrapped = client.post("/v1/completions", json={
            "prompt": [1, 2], "max_tokens": 100, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}).json()
        jsonschema.validate(json.loads(wrapped["choices"][0]["text"]), SCHEMA)
        bad = client.post("/v1/completions", json={
            "prompt": [1, 2], "max_tokens": 4, "structured_outputs": {"json": "{nope"}})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "Invalid JSON grammar specification."


def test_logprobs_as_token_ids_and_vllm_limit(start_sim: StartSim) -> None:
    # _create_completion_logprobs with return_tokens_as_token_ids; the top dict holds the first
    # K + 1 candidates (the chosen one among the top K here); max_logprobs 20.
    sim = start_sim(flavor="vllm", context_length=256, output_tokens_mean=10_000)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        choice = client.post("/v1/completions", json={
            "prompt": [1, 2], "max_tokens": 5, "logprobs": 3, "return_tokens_as_token_ids": True,
            "return_token_ids": True}).json()["choices"][0]
        too_many = client.post("/v1/completions", json={
            "prompt": [1, 2], "max_tokens": 5, "logprobs": 21})
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{i}" for i in choice["token_ids"]]
    assert len(logprobs["token_logprobs"]) == 5 and choice["prompt_token_ids"] == [1, 2]
    assert [len(row) for row in logprobs["top_logprobs"]] == [3] * 5
    assert all(row[token] == value for row, token, value in zip(
        logprobs["top_logprobs"], logprobs["tokens"], logprobs["token_logprobs"], strict=True))
    assert logprobs["text_offset"][0] == 0
    assert too_many.status_code == 400
    assert too_many.json()["error"]["message"] == (
        "Requested sample logprobs of 21, which is greater than max allowed: 20")


def test_thinking_tags_are_text_whatever_skip_special_tokens(start_sim: StartSim) -> None:
    """Qwen3.6's tokenizer marks `<think>` and `</think>` `special: false`: skipping special
    tokens (vLLM's default) keeps them; the end-of-turn token is in the ids, never the text."""
    sim = start_sim(flavor="vllm", context_length=256, thinking=True, output_tokens_mean=8)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        kept, skipped = (client.post("/v1/completions", json={
            "prompt": [1, 2], "max_tokens": 100, "skip_special_tokens": skip,
            "return_token_ids": True}).json()["choices"][0] for skip in (False, True))
    assert kept["token_ids"] == skipped["token_ids"] and kept["token_ids"][0] == 248068
    assert kept["token_ids"][-1] == 248046 and kept["stop_reason"] is None
    assert kept["text"] == skipped["text"]
    assert kept["text"].startswith("<think>\n") and "</think>\n\n" in kept["text"]
    assert "<|im_end|>" not in kept["text"]


def test_a_stop_string_ends_the_answer_and_is_its_stop_reason(start_sim: StartSim) -> None:
    """vLLM (`StopChecker.check_stop_strings`): the returned text is cut before the stop string,
    the token ids run to the token that completed it, `finish_reason` "stop" and `stop_reason`
    the string; vLLM has no `matched_stop`. The match is on the text it returns: `</think>`
    is text in Qwen3.6 whatever skip_special_tokens says, so it stops the answer either way."""
    sim = start_sim(flavor="vllm", context_length=256, thinking=True, output_tokens_mean=8)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        def ask(**extra: object) -> dict[str, Any]:
            return client.post("/v1/completions", json={
                "prompt": [1, 2], "max_tokens": 100, "return_token_ids": True,
                **extra}).json()["choices"][0]

        full = ask(skip_special_tokens=False)
        stop = " " + str(full["text"]).split(" ")[3]
        cut = ask(skip_special_tokens=False, stop=[stop])
        hidden = ask(stop="</think>")
        shown = ask(skip_special_tokens=False, stop="</think>")
    text, ids = str(full["text"]), list(full["token_ids"])
    assert (cut["finish_reason"], cut["stop_reason"]) == ("stop", stop)
    assert "matched_stop" not in cut and full["stop_reason"] is None
    assert cut["text"] == text[:text.index(stop)]
    assert cut["token_ids"] == ids[:len(cut["token_ids"])] and len(cut["token_ids"]) < len(ids)
    assert hidden == shown
    assert shown["stop_reason"] == "</think>" and shown["text"] == text[:text.index("</think>")]
    assert shown["token_ids"][-1] == 248069


def test_a_vllm_chat_request_renders_its_messages_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM chat route sizes the budget from the rendered prompt and hands those ids on:
    the template is rendered (and encoded) once per request, not again by the chat path."""
    from fleetgen.simulator import chat
    from fleetgen.simulator.config import SimConfig
    from fleetgen.simulator.vllm_api import parse_chat_vllm

    encoded: list[str] = []
    real_encode = chat.encode

    def counting_encode(text: str) -> list[int]:
        encoded.append(text)
        return real_encode(text)

    monkeypatch.setattr(chat, "encode", counting_encode)
    config = SimConfig(flavor="vllm", context_length=4096)
    job = parse_chat_vllm({"messages": [{"role": "user", "content": "hello there"}]}, config,
                          lambda rid: False)
    assert len(encoded) == 1
    assert job.items[0].prompt == real_encode(encoded[0])
