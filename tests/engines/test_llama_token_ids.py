"""`--token-ids` on a real llama-server (llama.cpp): its OpenAI answer carries the generated ids
only inside `__verbose` (asked with `return_tokens` and `verbose`), and they are the ids it
sampled (the same as its logprobs name), one per completion token."""

from __future__ import annotations

import httpx

from fleetgen.engine import GenerateOptions
from fleetgen.engine.openai import PROTOCOL
from fleetgen.engine.preflight import returns_token_ids
from tests.engines.llama import LlamaServer

PROMPT = list(range(1000, 1040))


def test_llama_cpp_returns_its_ids_under_verbose(llama: LlamaServer) -> None:
    with httpx.Client(base_url=llama.url, timeout=120.0) as http:
        plain = http.post("/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_tokens": True})
        assert plain.status_code == 200, plain.text
        # Without `verbose` the OpenAI shape has no ids at all: why the client asks for both.
        assert "tokens" not in plain.json()["choices"][0] and "__verbose" not in plain.json()
        scored = http.post("/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "n_probs": 1}).json()
    client = PROTOCOL.connect(llama.url, timeout_s=120, concurrency=1)
    try:
        gen = client.generate(PROMPT, 8, {"temperature": 0}, "ids:1:ab",
                              GenerateOptions(token_ids=True))
        probe = returns_token_ids(client)
    finally:
        client.close()
    assert gen.output_ids is not None and len(gen.output_ids) == gen.completion_tokens > 0
    assert gen.output_ids == [t["id"] for t in scored["choices"][0]["logprobs"]["content"]]
    assert probe.ok, probe.detail
