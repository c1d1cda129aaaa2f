"""OpenAI Batch request lines: the custom_id is the id, the body's prompt and options are read
in fleetgen's names, the whole line is carried through, and what cannot be sent is rejected
with a reason naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from producer.rows import BadRow, Row, parse_row

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def batch(body: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    line: dict[str, Any] = {"custom_id": "req-1", "method": "POST", "url": CHAT, "body": body}
    line.update(envelope)
    return {k: v for k, v in line.items() if v is not ...}


def parsed(obj: dict[str, Any]) -> Row:
    row = parse_row(7, obj, source="f.jsonl", position=3)
    assert isinstance(row, Row), row
    return row


def rejected(obj: dict[str, Any]) -> BadRow:
    row = parse_row(7, obj, source="f.jsonl", position=3)
    assert isinstance(row, BadRow), row
    assert (row.line, row.source, row.position) == (7, "f.jsonl", 3)
    return row


def test_a_chat_request_gives_messages_options_and_carries_the_line() -> None:
    line = batch({"model": "gpt-4o-mini", "messages": USER, "temperature": 0.2, "top_p": 0.9,
                  "seed": 11, "stop": "END", "max_tokens": 300, "n": 4})
    row = parsed(line)
    assert row.id == "req-1" and row.messages == USER and row.prompt is None
    assert row.sampling == {"temperature": 0.2, "top_p": 0.9, "seed": 11, "stop": ["END"]}
    assert (row.max_tokens, row.n, row.json_schema) == (300, 4, None)
    # The whole line reaches the output: an exporter needs custom_id and url back.
    assert row.fields == line


def test_a_completions_request_is_sent_as_text_without_a_template() -> None:
    row = parsed(batch({"model": "m", "prompt": "Once upon"}, url="/v1/completions"))
    assert row.prompt == "Once upon" and row.messages is None
    row = parsed(batch({"prompt": ["Only one"]}, url="/v1/completions"))
    assert row.prompt == "Only one"


def test_method_and_url_may_be_left_out_and_the_body_decides() -> None:
    row = parsed({"custom_id": "x", "body": {"prompt": "text"}})
    assert row.prompt == "text" and row.id == "x"
    row = parsed({"custom_id": "y", "body": {"messages": USER}})
    assert row.messages == USER


@pytest.mark.parametrize(("body", "cap"), [
    ({"max_tokens": 100, "max_completion_tokens": 40}, 40),
    ({"max_tokens": 40, "max_completion_tokens": 100}, 40),
    ({"max_completion_tokens": 77}, 77),
    ({"max_tokens": None}, None),
])
def test_the_smaller_of_max_tokens_and_max_completion_tokens_is_the_cap(
        body: dict[str, Any], cap: int | None) -> None:
    assert parsed(batch({"messages": USER, **body})).max_tokens == cap


def test_options_that_ask_for_nothing_are_no_reason_to_refuse_a_row() -> None:
    row = parsed(batch({"messages": USER, "stream": False, "logprobs": False, "tools": None,
                        "frequency_penalty": 0, "presence_penalty": 0.0, "stop": []}))
    assert row.sampling == {} and row.max_tokens is None and row.n is None


@pytest.mark.parametrize(("line", "reason"), [
    # the envelope
    ({"method": "POST", "url": CHAT, "body": {"messages": USER}},
     "bad_custom_id: a Batch line needs a custom_id"),
    (batch({"messages": USER}, custom_id=""), "bad_custom_id: custom_id must be a non-empty"),
    (batch({"messages": USER}, custom_id=12), "bad_custom_id: custom_id must be a non-empty "
                                              "string, got int"),
    (batch({"messages": USER}, method="GET"), "bad_method: method must be POST, got 'GET'"),
    (batch({"input": "x"}, url="/v1/embeddings"),
     "unsupported_url: url '/v1/embeddings' is not supported"),
    (batch({"messages": USER}, url="/v1/responses"), "unsupported_url: url '/v1/responses'"),
    (batch("a string"), "bad_body: body must be an object, got str"),  # type: ignore[arg-type]
    # the prompt
    (batch({"model": "m"}), "no_prompt: body has neither messages nor prompt"),
    (batch({"messages": USER, "prompt": "x"}), "bad_body: body has both messages and prompt"),
    (batch({"prompt": "x"}), f"bad_body: {CHAT} takes body.messages, not body.prompt"),
    (batch({"messages": USER}, url="/v1/completions"),
     "bad_body: /v1/completions takes body.prompt, not body.messages"),
    (batch({"prompt": [1, 2, 3]}, url="/v1/completions"), "bad_prompt: body.prompt holds token"),
    (batch({"prompt": [[1, 2]]}, url="/v1/completions"), "bad_prompt: body.prompt holds token"),
    (batch({"prompt": ["a", "b"]}, url="/v1/completions"),
     "bad_prompt: body.prompt holds 2 prompts"),
    (batch({"prompt": " "}, url="/v1/completions"), "empty_prompt: body.prompt is empty"),
    (batch({"messages": "hi"}), "bad_messages: body.messages must be a list of turns"),
    (batch({"messages": [{"role": "robot", "content": "x"}]}),
     "bad_messages: body.messages turn 0 has unknown role 'robot'"),
    # the options
    (batch({"messages": USER, "tools": [{"type": "function"}]}),
     "unsupported_option: body.tools is not supported"),
    (batch({"messages": USER, "tools": [], "tool_choice": "auto"}),
     "unsupported_option: body.tools, body.tool_choice are not supported"),
    (batch({"messages": USER, "stream": True}), "unsupported_option: body.stream is not "
                                                "supported (results are written whole"),
    (batch({"messages": USER, "logprobs": True, "top_logprobs": 5}),
     "unsupported_option: body.logprobs, body.top_logprobs are not supported (log-probabilities "
     "are asked for the whole run, with fleetgen produce --logprobs)"),
    (batch({"messages": USER, "response_format": {"type": "structural_tag"}}),
     "unsupported_option: body.response_format.type 'structural_tag' is not supported"),
    (batch({"messages": USER, "response_format": "json"}),
     "bad_option: body.response_format must be an object, got str"),
    (batch({"messages": USER, "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x"}}}),
     "bad_option: body.response_format.json_schema.schema is required for type json_schema"),
    (batch({"messages": USER, "response_format": {"type": "json_schema",
                                                  "json_schema": {"schema": [1]}}}),
     "bad_json_schema: body.response_format.json_schema.schema must be a JSON object"),
    ({**batch({"messages": USER, "response_format": {"type": "json_object"}}),
      "json_schema": {"type": "object"}},
     "bad_option: json_schema and body.response_format both ask for a schema"),
    (batch({"messages": USER, "presence_penalty": 0.5}),
     "unsupported_option: body.presence_penalty"),
    (batch({"messages": USER, "top_k": 5}), "unsupported_option: body.top_k"),
    (batch({"messages": USER, "max_tokens": 0}),
     "bad_option: body.max_tokens must be a positive integer, got 0"),
    (batch({"messages": USER, "max_completion_tokens": -5}),
     "bad_option: body.max_completion_tokens must be a positive integer, got -5"),
    (batch({"messages": USER, "max_tokens": 10.5}), "bad_option: body.max_tokens must be"),
    (batch({"messages": USER, "temperature": "hot"}),
     "bad_option: body.temperature must be a number >= 0, got 'hot'"),
    (batch({"messages": USER, "temperature": -1}), "bad_option: body.temperature must be"),
    (batch({"messages": USER, "top_p": 0}), "bad_option: body.top_p must be a number in (0, 1]"),
    (batch({"messages": USER, "seed": 1.5}), "bad_option: body.seed must be an integer"),
    (batch({"messages": USER, "seed": True}), "bad_option: body.seed must be an integer"),
    (batch({"messages": USER, "stop": ["ok", 3]}), "bad_option: body.stop must be a non-empty "
                                                   "string or a list of at most 32 of them"),
    (batch({"messages": USER, "n": 0}), "bad_option: body.n must be an integer in 1..128"),
    (batch({"messages": USER, "n": 129}), "bad_option: body.n must be an integer in 1..128"),
])
def test_what_cannot_be_sent_is_rejected_with_a_reason_naming_it(line: dict[str, Any],
                                                                 reason: str) -> None:
    bad = rejected(line)
    assert bad.reason.startswith(reason), bad.reason


@pytest.mark.parametrize(("response_format", "schema"), [
    # SGLang's reading (serving_completions.py `_build_sampling_params`), sent natively
    ({"type": "json_object"}, '{"type":"object"}'),
    ({"type": "json_schema", "json_schema": {"name": "colour", "strict": True, "schema": {
        "type": "object", "properties": {"name": {"type": "string"}}}}},
     '{"type":"object","properties":{"name":{"type":"string"}}}'),
    ({"type": "text"}, None),
    (None, None),
])
def test_response_format_becomes_the_rows_schema(response_format: Any,
                                                 schema: str | None) -> None:
    row = parsed(batch({"messages": USER, "response_format": response_format, "n": 2}))
    assert (row.json_schema, row.n) == (schema, 2)


def test_a_rejected_batch_line_keeps_its_custom_id_when_it_has_one() -> None:
    assert rejected(batch({"messages": USER, "tools": []})).id == "req-1"
    # Without a usable custom_id the id is derived from the line, the same every time.
    first = rejected({"url": CHAT, "body": {"messages": USER}}).id
    assert first.startswith("row-") and first == rejected({"url": CHAT,
                                                           "body": {"messages": USER}}).id


def test_a_plain_row_with_a_body_field_is_not_a_batch_line() -> None:
    row = parsed({"id": "p", "messages": USER, "body": {"anything": 1}, "url": "http://x"})
    assert row.id == "p" and row.fields["body"] == {"anything": 1}
    # A custom_id without a body is an ordinary field too.
    row = parsed({"custom_id": "c", "prompt": "text"})
    assert row.prompt == "text" and row.fields["custom_id"] == "c"
