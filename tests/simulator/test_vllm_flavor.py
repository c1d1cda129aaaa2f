"""`--flavor vllm`: the simulator's /v1/completions answers as vLLM 0.33.0 does (its length rule
and error body), and the SGLang-only endpoints are not there."""

from __future__ import annotations

import httpx
import pytest

from tests.simulator.sim_helpers import StartSim

CONTEXT = 64


@pytest.fixture
def client(start_sim: StartSim) -> httpx.Client:
    sim = start_sim(flavor="vllm", context_length=CONTEXT, output_tokens_mean=10_000)
    return httpx.Client(base_url=sim.url, timeout=10)


def complete(client: httpx.Client, prompt_tokens: int, max_tokens: int) -> httpx.Response:
    return client.post("/v1/completions", json={
        "model": "m", "prompt": list(range(1, prompt_tokens + 1)), "max_tokens": max_tokens,
        "ignore_eos": True})


def test_max_tokens_past_the_context_is_clamped_not_refused(client: httpx.Client) -> None:
    # api_utils.py `get_max_tokens`: min(max_tokens, max_model_len - input)
    response = complete(client, 50, 1000)
    assert response.status_code == 200
    body = response.json()
    assert body["usage"] == {"prompt_tokens": 50, "completion_tokens": CONTEXT - 50,
                             "total_tokens": CONTEXT}
    assert body["choices"][0]["finish_reason"] == "length"


def test_a_prompt_of_the_whole_context_is_refused(client: httpx.Client) -> None:
    # input_processor.py `_validate_prompt_len`, prompt_len == max_prompt_len
    response = complete(client, CONTEXT, 1)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["message"].startswith(
        f"The decoder prompt (length {CONTEXT}) plus the number of requested output tokens "
        f"(at least 1) is longer than the maximum model length of {CONTEXT}.")


def test_a_longer_prompt_is_refused_with_its_count(client: httpx.Client) -> None:
    # renderers/params.py `_token_len_check`
    response = complete(client, CONTEXT + 5, 1)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"This model's maximum context length is {CONTEXT} tokens. However, your prompt "
        f"contains {CONTEXT + 5} input tokens, which exceeds this limit even without any "
        "output tokens. Please reduce the length of the input prompt.")


def test_only_the_openai_endpoints_and_an_instant_health(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()["data"][0]
    assert (models["owned_by"], models["max_model_len"]) == ("vllm", CONTEXT)
    assert client.get("/health").status_code == 200
    for path in ("/ready", "/server_info", "/get_server_info"):
        assert client.get(path).status_code == 404, path
    assert client.post("/generate", json={"input_ids": [1]}).status_code in (404, 405)
