"""SGLang's protocol over real HTTP: length rules, bodies, sampling checks, batches, info."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.sim import ENDLESS, StartSim, generate

CONTEXT = 100  # max_req_len 99, max_req_input_len 94


@pytest.fixture
def client(start_sim: StartSim) -> Iterator[httpx.Client]:
    sim = start_sim(context_length=CONTEXT, output_tokens_mean=ENDLESS)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        yield client


def error_message(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert set(body) == {"error"}
    return body["error"]["message"]


def test_rule_1_input_not_shorter_than_context(client: httpx.Client) -> None:
    assert error_message(generate(client, [1] * CONTEXT, 0)) == (
        "The input (100 tokens) is longer than the model's context length (100 tokens)."
    )
    # One token shorter passes rule 1 and is caught by the scheduler's rule 3.
    assert error_message(generate(client, [1] * (CONTEXT - 1), 0)).startswith("Input length (99")


def test_rule_2_prompt_plus_completion_over_context(client: httpx.Client) -> None:
    assert generate(client, [1] * 50, 50).status_code == 200  # total exactly the context
    assert error_message(generate(client, [1] * 50, 51)) == (
        "Requested token count exceeds the model's maximum context length of 100 tokens. "
        "You requested a total of 101 tokens: 50 tokens from the input messages and 51 tokens "
        "for the completion. Please reduce the number of tokens in the input messages or the "
        "completion to fit within the limit."
    )


def test_rule_3_scheduler_input_limit(client: httpx.Client) -> None:
    assert generate(client, [1] * 93, 1).status_code == 200
    assert error_message(generate(client, [1] * 94, 1)) == (
        "Input length (94 tokens) exceeds the maximum allowed length (94 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )


def test_rule_3_uses_kv_capacity_when_smaller(start_sim: StartSim) -> None:
    sim = start_sim(context_length=CONTEXT, max_total_tokens=60)
    with httpx.Client(base_url=sim.url) as client:
        assert generate(client, [1] * 53, 1).status_code == 200
        assert error_message(generate(client, [1] * 54, 1)).startswith(
            "Input length (54 tokens) exceeds the maximum allowed length (54 tokens)."
        )
        info = client.get("/get_server_info").json()
        assert (info["max_total_num_tokens"], info["max_req_input_len"]) == (60, 54)


def test_silent_clamp_to_max_req_len(client: httpx.Client) -> None:
    meta = generate(client, [1] * 50, 50).json()["meta_info"]
    # max_req_len 99 - 50 input - 1 = 48, although the client asked for 50.
    assert meta["completion_tokens"] == 48
    assert meta["finish_reason"] == {"type": "length", "length": 48}


def test_rules_apply_in_order(client: httpx.Client) -> None:
    # Breaks rules 1, 2 and 3 at once: rule 1's message wins.
    assert error_message(generate(client, [1] * 200, 500)).startswith("The input (200 tokens)")
    # Breaks rules 2 and 3: rule 2's message wins.
    assert error_message(generate(client, [1] * 95, 10)).startswith("Requested token count")


def test_extra_prompt_tokens_count_against_the_context(start_sim: StartSim) -> None:
    sim = start_sim(context_length=CONTEXT, extra_prompt_tokens=10)
    with httpx.Client(base_url=sim.url) as client:
        assert generate(client, [1] * 40, 2).json()["meta_info"]["prompt_tokens"] == 50
        assert "40 tokens from the input" not in error_message(generate(client, [1] * 40, 55))
        assert "50 tokens from the input" in error_message(generate(client, [1] * 40, 55))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0."),
        ({"temperature": -0.5}, "temperature must be a non-negative finite number, got -0.5."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"min_p": 1.2}, "min_p must be in [0, 1], got 1.2."),
        ({"repetition_penalty": 0},
         "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 0."),
        ({"repetition_penalty": 2.5},
         "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 2.5."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        ({"min_new_tokens": 5, "max_new_tokens": 3},
         "min_new_tokens must be in [0, max_new_tokens(3)], got 5."),
    ],
)
def test_sampling_params_are_validated(
    client: httpx.Client, params: dict[str, Any], message: str
) -> None:
    response = client.post("/generate", json={"input_ids": [1, 2], "sampling_params": params})
    assert error_message(response) == message


def test_defaults_and_unknown_sampling_keys(client: httpx.Client) -> None:
    # No max_new_tokens: the tokenizer's rule 2 is skipped (it reads None), and the
    # scheduler clamps its default of 128 to max_req_len 99 - 2 - 1 = 96.
    default = client.post("/generate", json={"input_ids": [1, 2]})
    assert default.status_code == 200
    assert default.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 96}
    known = client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 3, "stop": ["x"], "temperature": 0, "top_k": -1}})
    assert known.json()["meta_info"]["completion_tokens"] == 3
    # The closed schema: an unknown key is a 400 with a string body.
    unknown = client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {
        "max_new_tokens": 3, "no_such_knob": 3}})
    assert unknown.status_code == 400
    assert unknown.json()["error"].startswith("unknown field `no_such_knob`, expected one of ")


def test_native_response_shape(client: httpx.Client) -> None:
    body = generate(client, [5, 6, 7], 4, rid="row-17").json()
    assert set(body) == {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    assert set(meta) == {
        "id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions",
        "reasoning_tokens", "completion_tokens", "cached_tokens", "weight_versions",
        "cached_tokens_details", "e2e_latency",
    }
    assert (meta["id"], meta["prompt_tokens"], meta["completion_tokens"]) == ("row-17", 3, 4)
    assert meta["cached_tokens"] == 0
    assert len(body["output_ids"]) == 4
    assert len(body["text"].split(" ")) == 4


def test_text_prompt_is_counted_by_words_and_punctuation(client: httpx.Client) -> None:
    body = client.post("/generate", json={
        "text": "Hello, simulated world!", "sampling_params": {"max_new_tokens": 1}}).json()
    assert body["meta_info"]["prompt_tokens"] == 5


def test_batch_answers_in_input_order(client: httpx.Client) -> None:
    prompts = [[1, 2], [3, 4, 5], [6]]
    batch = client.post("/generate", json={
        "input_ids": prompts, "sampling_params": {"max_new_tokens": 5}, "rid": ["a", "b", "c"],
    }).json()
    assert [b["meta_info"]["id"] for b in batch] == ["a", "b", "c"]
    assert [b["meta_info"]["prompt_tokens"] for b in batch] == [2, 3, 1]
    singles = [generate(client, p, 5).json()["text"] for p in prompts]
    assert [b["text"] for b in batch] == singles
    texts = client.post("/generate", json={"text": ["one two", "three"],
                                           "sampling_params": {"max_new_tokens": 1}}).json()
    assert [t["meta_info"]["prompt_tokens"] for t in texts] == [2, 1]


def test_one_bad_prompt_fails_the_whole_batch(client: httpx.Client) -> None:
    response = client.post("/generate", json={
        "input_ids": [[1, 2], [1] * 120], "sampling_params": {"max_new_tokens": 5}})
    assert error_message(response).startswith("The input (120 tokens)")


def test_parallel_samples_differ(client: httpx.Client) -> None:
    body = client.post("/generate", json={
        "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8, "n": 2}}).json()
    assert isinstance(body, list)
    assert len(body) == 2
    assert body[0]["text"] != body[1]["text"]


def test_bad_requests_get_a_native_400(client: httpx.Client) -> None:
    assert error_message(client.post("/generate", json={"rid": "x"})) == (
        "Either text, input_ids or input_embeds should be provided.")
    assert "not valid JSON" in error_message(client.post("/generate", content=b"{oops"))
    assert "stream" in error_message(
        client.post("/generate", json={"input_ids": [1], "stream": True}))
    bad_id = client.post("/generate", json={"input_ids": [1, "a"]})
    assert (bad_id.status_code, bad_id.json()) == (
        400, {"error": 'invalid type: string "a", expected i64'})
    assert error_message(client.post("/generate", json={"input_ids": []})) == (
        "input_ids cannot be empty.")


def test_openai_completions(client: httpx.Client) -> None:
    body = client.post("/v1/completions", json={"model": "x", "prompt": [1, 2, 3]}).json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19}
    assert body["choices"][0]["text"] == generate(client, [1, 2, 3], 16).json()["text"]
    texts = client.post("/v1/completions", json={"prompt": ["a b", "c"], "max_tokens": 2}).json()
    assert [c["index"] for c in texts["choices"]] == [0, 1]
    assert texts["usage"]["prompt_tokens"] == 3


def test_openai_errors_use_the_openai_body(client: httpx.Client) -> None:
    response = client.post("/v1/completions", json={"prompt": [1] * 50, "max_tokens": 60})
    assert response.status_code == 400
    body = response.json()
    assert body["message"].startswith("Requested token count exceeds")
    assert {k: v for k, v in body.items() if k != "message"} == {
        "object": "error", "type": "BadRequestError", "param": None, "code": 400,
    }
    top_p = client.post("/v1/completions", json={"prompt": "hi", "top_p": 2})
    assert top_p.json()["message"] == "top_p must be in (0, 1], got 2."


def test_models_and_info_endpoints(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "fleetgen-sim"
    assert models["data"][0]["owned_by"] == "sglang"
    assert models["data"][0]["max_model_len"] == CONTEXT
    for path in ("/get_server_info", "/server_info"):
        info = client.get(path).json()
        assert info["context_length"] == CONTEXT
        assert info["max_req_input_len"] == 94
        # Not passed on the command line: null at the top level, the limit in force
        # per DP rank in internal_states.
        assert info["max_running_requests"] is None
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 64
        assert info["model_path"] == "fleetgen-sim"
        assert info["version"] == "0.5.23"
    for path in ("/get_model_info", "/model_info"):
        model = client.get(path).json()
        assert model["model_path"] == "fleetgen-sim"
        assert model["is_generation"] is True
        assert "context_length" not in model
    assert client.get("/health").status_code == 200
    assert client.get("/health_generate").status_code == 200


def test_metrics_text_has_sglang_and_simulator_names(client: httpx.Client) -> None:
    generate(client, [1, 2, 3], 4)
    text = client.get("/metrics").text
    for name in (
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
        "fleetgen_sim_busy_slot_seconds_total", "fleetgen_sim_max_running_requests",
        "fleetgen_sim_speed",
    ):
        assert f"\n{name}{{" in text
    assert 'sglang:prompt_tokens_total{model_name="fleetgen-sim"} 3.0' in text
    assert 'sglang:generation_tokens_total{model_name="fleetgen-sim"} 4.0' in text
    assert 'fleetgen_sim_requests_total{model_name="fleetgen-sim",code="200"} 1.0' in text


def test_api_key(start_sim: StartSim) -> None:
    sim = start_sim(api_key="s3cret")
    with httpx.Client(base_url=sim.url) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            response = client.post("/generate", json={"input_ids": [1]}, headers=headers)
            assert response.status_code == 401
            assert response.json() == {"error": "Unauthorized"}
        assert client.get("/v1/models").status_code == 401
        ok = client.post("/generate", json={"input_ids": [1]},
                         headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        for path in ("/health", "/health_generate", "/metrics"):
            assert client.get(path).status_code == 200
        assert "s3cret" not in client.get(
            "/get_server_info", headers={"Authorization": "Bearer s3cret"}).text


def test_determinism_across_servers_and_seeds(start_sim: StartSim) -> None:
    twins = start_sim(count=2, seed=3)
    other = start_sim(seed=4)
    answers = []
    for url in [*twins.urls, other.url]:
        with httpx.Client(base_url=url) as client:
            answers.append(generate(client, [9, 8, 7], 2000).json())
    assert answers[0]["text"] == answers[1]["text"]
    assert answers[0]["output_ids"] == answers[1]["output_ids"]
    assert answers[0]["text"] != answers[2]["text"]


def test_finish_reason_stop_and_length(start_sim: StartSim) -> None:
    sim = start_sim(context_length=10_000, output_tokens_mean=64)
    with httpx.Client(base_url=sim.url) as client:
        free = generate(client, [4, 4], 5000).json()["meta_info"]
        natural = free["completion_tokens"]
        assert free["finish_reason"] == {"type": "stop", "matched": 248046}
        fits = generate(client, [4, 4], natural).json()["meta_info"]
        assert fits["finish_reason"]["type"] == "stop"
        assert fits["completion_tokens"] == natural
        cut = generate(client, [4, 4], natural - 1).json()["meta_info"]
        assert cut["finish_reason"] == {"type": "length", "length": natural - 1}
        assert cut["completion_tokens"] == natural - 1


def test_mean_output_length_over_2000_requests(start_sim: StartSim) -> None:
    sim = start_sim(context_length=2_000_000, output_tokens_mean=256)
    lengths: list[int] = []
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        for start in range(0, 2000, 250):
            batch = client.post("/generate", json={
                "input_ids": [[i, i + 1, 77] for i in range(start, start + 250)],
                "sampling_params": {"max_new_tokens": 1_000_000},
            }).json()
            lengths += [b["meta_info"]["completion_tokens"] for b in batch]
    assert len(lengths) == 2000
    mean = sum(lengths) / len(lengths)
    assert 0.9 * 256 <= mean <= 1.1 * 256
    assert min(lengths) >= 1


def test_vllm_flavour_metrics_say_the_queue_and_never_the_slots(start_sim: StartSim) -> None:
    """vLLM 0.32 reports its queue (v1/metrics/loggers.py `vllm:num_requests_running`,
    `vllm:num_requests_waiting`) and no slot count anywhere: neither does its flavour, so every
    test of it meets what users meet (the worker paces from the queue)."""
    sim = start_sim(flavor="vllm", max_running_requests=5)
    with httpx.Client(base_url=sim.url) as client:
        text = client.get("/metrics").text
        assert 'vllm:num_requests_running{model_name="fleetgen-sim"} 0.0' in text
        assert 'vllm:num_requests_waiting{model_name="fleetgen-sim"} 0.0' in text
        assert "max_running_requests" not in text and "sglang:" not in text
        assert "max_running_requests" not in client.get("/v1/models").text
        assert client.get("/server_info").status_code == 404
