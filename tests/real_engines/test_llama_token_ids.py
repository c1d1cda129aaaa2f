"""`--token-ids` on a real llama-server (llama.cpp): its OpenAI answer carries the generated ids
only inside `__verbose` (asked with `return_tokens` and `verbose`), and they are the ids it
sampled (the same as its logprobs name), one per completion token; and a whole run on it
exports as tokens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import orjson

from fleetgen.engine import GenerateOptions
from fleetgen.engine.openai import PROTOCOL
from fleetgen.engine.preflight import returns_token_ids
from fleetgen.local.fleet import LocalFleet
from tests.support.content import input_rows
from tests.support.llama import LlamaServer
from tests.support.pipeline import assert_exactly_once, make_prompts, run_pipeline

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


def test_a_run_on_llama_cpp_keeps_token_ids_and_exports_them(
        llama: LlamaServer, llama_fleet: LocalFleet,
        tmp_path: Path) -> None:
    """The whole path on the real engine: the producer's start-up probe, a real worker asking
    for `return_tokens` + `verbose`, the drainer, then the tokens export (which checks every
    prompt against llama.cpp's own count and the digest of the ids sent)."""
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    expected = set(make_prompts(prompts, 12, seed=9)["good"])
    run_pipeline(llama_fleet, prompts, "llama-ids", out, timeout_s=240, context_length=None,
                 engine_url=(llama.url,), engine_protocol="openai", max_output_tokens=16,
                 token_ids=True)
    results = assert_exactly_once(out, expected)["results"]
    assert results and all(len(r["output_ids"]) == r["completion_tokens"] > 0 for r in results)
    # The random-weight model never closes its reasoning: every answer is unfinished, which
    # the export leaves out unless asked to keep.
    done = subprocess.run([sys.executable, "-m", "fleetgen", "export", str(out), "--format",
                           "tokens", "--include-unfinished"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = {x["id"]: x for x in map(orjson.loads,
                                     (out / "export.tokens.jsonl").read_bytes().splitlines())}
    sent = input_rows(prompts, expected)
    for r in results:
        assert lines[r["id"]]["input_ids"] == sent[r["id"]][0] + r["output_ids"], r["id"]
        assert sum(lines[r["id"]]["loss_mask"]) == r["completion_tokens"]


def test_llama_cpp_ends_with_its_stop_token_and_names_its_stop_word(llama: LlamaServer) -> None:
    """llama.cpp keeps the end-of-turn token in its tokens and counts it (server-context.cpp
    `process_token` pushes every sampled token before its EOG check), the text without it;
    a stop string is named only by `__verbose.stopping_word`, which the client reads."""
    with httpx.Client(base_url=llama.url, timeout=120.0) as http:
        ended = http.post("/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_tokens": True,
            "verbose": True, "logit_bias": [[248046, 100]]}).json()
    assert ended["__verbose"]["tokens"] == [248046] and ended["usage"]["completion_tokens"] == 1
    assert ended["choices"][0]["text"] == "" and ended["__verbose"]["stop_type"] == "eos"
    client = PROTOCOL.connect(llama.url, timeout_s=120, concurrency=1)
    try:
        free = client.generate(PROMPT, 8, {"temperature": 0}, "ids:2:ab",
                               GenerateOptions(token_ids=True))
        stop = free.text[2:5]
        cut = client.generate(PROMPT, 8, {"temperature": 0, "stop": [stop]}, "ids:3:ab",
                              GenerateOptions(token_ids=True))
    finally:
        client.close()
    assert free.stop_matched is None and len(stop) == 3
    assert cut.stop_matched == stop and cut.finish_reason == "stop"
    assert free.text.startswith(cut.text) and stop not in cut.text
    assert cut.output_ids == free.output_ids[:len(cut.output_ids)]  # through the stop's token
