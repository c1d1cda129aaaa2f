"""The generate options (reasoning split, JSON schema, logprobs) through each client, over real
HTTP against the simulator: the request reaches the server in its own names, and the answer,
its output ids and its logprobs come back exactly as the simulator's model makes them."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from fleetgen import errors
from fleetgen.engine import GenerateOptions
from fleetgen.engine.openai import PROTOCOL as OPENAI
from fleetgen.engine.openai import completion_body, parse_completion
from fleetgen.engine.sglang import PROTOCOL as SGLANG
from fleetgen.records.logprobs import compact
from fleetgen.records.outcomes import Generation
from fleetgen.simulator.answers import Style, compose, token_logprobs
from fleetgen.simulator.model import request_key
from tests.support.sim import StartSim

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "days": {"type": "integer", "minimum": 1}},
          "required": ["city", "days"]}
OPTIONS = GenerateOptions(keep_special_tokens=True, logprobs=3, json_schema=json.dumps(SCHEMA),
                          reasoning_first=True)
PROMPT = [101, 102, 103]
MEAN = 12


def expected(style: Style, budget: int, top: int) -> tuple[Any, dict[str, Any]]:
    """The simulator's answer and its compact logprobs (fleetgen/simulator/answers.py)."""
    key = request_key(0, PROMPT, 0, None)
    answer = compose(key, MEAN, budget, PROMPT, style)
    scored = token_logprobs(key, answer.output_ids, top)
    return answer, compact(answer.output_ids, [chosen for chosen, _ in scored],
                           [[(token, value) for value, token in ranked] for _, ranked in scored])


def check(gen: Generation, style: Style, budget: int = 200) -> None:
    answer, logprobs = expected(style, budget, OPTIONS.logprobs)
    assert gen.text == answer.text and gen.output_ids == answer.output_ids
    assert gen.logprobs == logprobs
    assert gen.text.startswith("<think>\n") and gen.output_ids[0] == 248068
    jsonschema.validate(json.loads(gen.text.split("</think>")[1]), SCHEMA)


def test_sglang_native_client(start_sim: StartSim) -> None:
    sim = start_sim(thinking=True, output_tokens_mean=MEAN, context_length=1024)
    client = SGLANG.connect(sim.url, timeout_s=10, concurrency=1)
    try:
        gen = client.generate(PROMPT, 200, {}, "opt:1:ab", OPTIONS)
        plain = client.generate(PROMPT, 200, {}, "opt:2:ab")
    finally:
        client.close()
    check(gen, Style(thinking=True, schema=SCHEMA, reasoning_first=True,
                     skip_special_tokens=False))
    # without options: no logprobs; the tags stay in the text all the same (Qwen3.6 marks
    # them `special: false`), the ids end with the end-of-turn token
    assert plain.logprobs is None and plain.text.startswith("<think>\n")
    assert plain.output_ids is not None and plain.output_ids[0] == 248068
    assert plain.output_ids[-1] == 248046 and plain.completion_tokens == len(plain.output_ids)


def test_vllm_client(start_sim: StartSim) -> None:
    sim = start_sim(flavor="vllm", thinking=True, output_tokens_mean=MEAN, context_length=1024)
    client = OPENAI.connect(sim.url, timeout_s=10, concurrency=1)
    try:
        gen = client.generate(PROMPT, 200, {}, "opt:1:ab", OPTIONS)
    finally:
        client.close()
    # vLLM with a reasoning parser applies the grammar after the reasoning by itself
    check(gen, Style(thinking=True, schema=SCHEMA, reasoning_first=True,
                     skip_special_tokens=False))


def test_sglang_v1_refuses_logprobs_but_splits_and_constrains(start_sim: StartSim) -> None:
    sim = start_sim(thinking=True, output_tokens_mean=MEAN, context_length=1024)
    client = OPENAI.connect(sim.url, timeout_s=10, concurrency=1)
    try:
        with pytest.raises(errors.PermanentError, match="native protocol"):
            client.generate(PROMPT, 200, {}, "opt:1:ab", OPTIONS)
        gen = client.generate(PROMPT, 200, {}, "opt:2:ab",
                              GenerateOptions(keep_special_tokens=True,
                                              json_schema=json.dumps(SCHEMA)))
    finally:
        client.close()
    # SGLang's /v1 sends no require_reasoning: the grammar holds from the first token
    answer, _ = expected(Style(thinking=True, schema=SCHEMA, skip_special_tokens=False), 200, 0)
    assert gen.text == answer.text and gen.output_ids == answer.output_ids
    jsonschema.validate(json.loads(gen.text), SCHEMA)


def test_llama_cpp_request_and_answer_shapes() -> None:
    """llama.cpp's names (server-schema.cpp `make_llama_cmpl_schema`) and its logprobs shape
    (server-task.cpp `probs_vector_to_json`): ids come from the logprobs."""
    body = completion_body([1, 2], 8, {}, None, OPTIONS, "llama.cpp")
    assert body["preserved_tokens"] == ["<think>", "</think>"]
    assert body["json_schema"] == SCHEMA and body["n_probs"] == 3
    assert "skip_special_tokens" not in body and "logprobs" not in body
    with pytest.raises(errors.PermanentError, match="not JSON"):
        completion_body([1], 8, {}, None, GenerateOptions(json_schema="{no"), "llama.cpp")
    content = [{"id": 7, "token": "a", "bytes": [97], "logprob": -0.51234,
                "top_logprobs": [{"id": 7, "token": "a", "bytes": [97], "logprob": -0.51234},
                                 {"id": 9, "token": "b", "bytes": [98], "logprob": -1.2}]}]
    gen = parse_completion({"choices": [{"text": "a", "index": 0, "finish_reason": "length",
                                         "logprobs": {"content": content}}],
                            "usage": {"prompt_tokens": 2, "completion_tokens": 1}}, 2)
    assert gen.output_ids == [7]
    assert gen.logprobs == {"ids": [7], "lp": [-0.512], "top_ids": [[7, 9]],
                            "top_lp": [[-0.512, -1.2]]}


def test_vllm_and_sglang_bodies() -> None:
    vllm = completion_body([1], 8, {}, None, OPTIONS, "vllm")
    assert vllm["structured_outputs"] == {"json": json.dumps(SCHEMA)}
    assert (vllm["logprobs"], vllm["return_tokens_as_token_ids"]) == (3, True)
    assert (vllm["skip_special_tokens"], vllm["return_token_ids"]) == (False, True)
    plain = completion_body([1], 8, {"seed": 1}, "m", GenerateOptions(), "vllm")
    assert plain == {"prompt": [1], "max_tokens": 8, "stream": False, "model": "m", "seed": 1}
