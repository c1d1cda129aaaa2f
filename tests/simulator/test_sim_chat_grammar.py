"""The simulator's /v1/chat/completions as SGLang 0.5.23's serving_chat sets a request up: the
thinking mode makes `require_reasoning` (so `reasoning_tokens` is counted and a grammar waits
for `</think>`), and `response_format` (json_schema, json_object) or `regex` constrains the
answer, with the server's 400 for a bad one. Before, the chat path never set
`require_reasoning` (reasoning_tokens 0 on a thinking request) and ignored both."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import pytest

from fleetgen.simulator.answers import THINK_END_ID
from tests.support.sim import StartSim

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}
THINKING = {"thinking": True, "output_tokens_mean": 30, "context_length": 2048}


def chat(url: str, **extra: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
        "model": "fleetgen-sim", "messages": [{"role": "user", "content": "Who are you?"}],
        "max_tokens": 400, **extra})


def test_a_thinking_request_reports_its_reasoning_tokens(start_sim: StartSim) -> None:
    sim = start_sim(**THINKING)
    body = chat(sim.url).json()
    ids = httpx.post(f"{sim.url}/generate", timeout=30, json={  # the same answer's ids
        "input_ids": httpx.post(f"{sim.url}/tokenize", json={
            "messages": [{"role": "user", "content": "Who are you?"}]}).json()["tokens"],
        "sampling_params": {"max_new_tokens": 400}}).json()["output_ids"]
    thought = ids.index(THINK_END_ID) + 1
    assert body["usage"]["reasoning_tokens"] == thought > 1
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": thought}
    assert body["choices"][0]["message"]["reasoning_content"]
    off = chat(sim.url, chat_template_kwargs={"enable_thinking": False}).json()
    assert off["usage"]["reasoning_tokens"] == 0
    assert off["usage"]["completion_tokens_details"] is None


@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
    # `set_json_schema`: a format's own `schema` is moved into `json_schema`.
    {"type": "json_schema", "schema": {**SCHEMA, "title": "person"}},
])
def test_a_json_schema_answer_follows_the_schema_after_the_reasoning(
        start_sim: StartSim, response_format: dict[str, Any]) -> None:
    sim = start_sim(**THINKING)
    message = chat(sim.url, response_format=response_format).json()["choices"][0]["message"]
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    # The grammar waits for `</think>` (require_reasoning on a server with a parser).
    assert message["reasoning_content"]


def test_json_object_and_regex_answers_honour_the_format(start_sim: StartSim) -> None:
    sim = start_sim(output_tokens_mean=30)
    content = chat(sim.url, response_format={"type": "json_object"}).json()[
        "choices"][0]["message"]["content"]
    assert isinstance(json.loads(content), dict)
    pattern = r"(yes|no), [A-Z][a-z]{2,6} \d{3}-\d{4}"
    answers = {chat(sim.url, regex=pattern, rid=f"r{i}").json()["choices"][0]["message"][
        "content"] for i in range(3)}
    assert all(re.fullmatch(pattern, a) for a in answers), answers
    text = chat(sim.url, response_format={"type": "text"}).json()
    assert text["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(("extra", "message"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "schema_ is required for json_schema response format request."),
    ({"response_format": {"type": "json_object"}, "regex": "a+"},
     "Only one of json_schema, regex, ebnf, or structural_tag can be set."),
    ({"regex": "(a"},
     "Failed to compile regex grammar: missing ), unterminated subpattern at position 0"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "not": {}}}}},
     "Failed to compile json grammar: "),
])
def test_a_bad_format_is_the_servers_400(start_sim: StartSim, extra: dict[str, Any],
                                         message: str) -> None:
    answer = chat(start_sim().url, **extra)
    assert answer.status_code == 400
    body = answer.json()
    assert body["message"].startswith(message), body
    assert {k: body[k] for k in ("object", "type", "param", "code")} == {
        "object": "error", "type": "BadRequestError", "param": None, "code": 400}
