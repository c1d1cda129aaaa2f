"""A plain row's own options: a `sampling` object (fleetgen's names, plus the row's max_tokens
cap and its number of samples n) and a `json_schema`; validated, or the row is rejected with
the option's name."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from producer.rows import BadRow, Row, parse_row


def row_with(**extra: Any) -> Row | BadRow:
    return parse_row(1, {"id": "r", "prompt": "text", **extra})


def test_a_sampling_object_gives_the_rows_options() -> None:
    sampling = {"temperature": 1, "top_p": 0.5, "top_k": 40, "min_p": 0.05,
                "repetition_penalty": 1.1, "seed": 3, "stop": "</s>", "max_tokens": 64, "n": 8}
    row = row_with(sampling=sampling)
    assert isinstance(row, Row)
    assert row.sampling == {"temperature": 1.0, "top_p": 0.5, "top_k": 40, "min_p": 0.05,
                            "repetition_penalty": 1.1, "seed": 3, "stop": ["</s>"]}
    assert isinstance(row.sampling["temperature"], float)
    assert (row.max_tokens, row.n) == (64, 8)
    assert row.fields["sampling"] == sampling  # carried through as given


def test_no_sampling_object_no_options_and_null_members_are_absent() -> None:
    row = row_with()
    assert isinstance(row, Row) and (row.sampling, row.max_tokens, row.n) == ({}, None, None)
    # Parquet gives a struct column's missing members as null.
    row = row_with(sampling={"temperature": None, "top_k": None, "seed": 5, "n": None})
    assert isinstance(row, Row) and row.sampling == {"seed": 5} and row.n is None


def test_top_k_minus_one_means_all() -> None:
    row = row_with(sampling={"top_k": -1})
    assert isinstance(row, Row) and row.sampling == {"top_k": -1}


def test_an_n_field_outside_sampling_is_just_a_field() -> None:
    row = row_with(n=3)
    assert isinstance(row, Row) and row.n is None and row.fields["n"] == 3


@pytest.mark.parametrize(("sampling", "reason"), [
    ("hot", "bad_option: sampling must be an object, got str"),
    ({"temp": 1}, "unsupported_option: sampling.temp is not supported (a sampling object "
                  "takes temperature, top_p, top_k, min_p, repetition_penalty, seed, stop, "
                  "max_tokens, n)"),
    ({"tools": [], "stream": True}, "unsupported_option: sampling.tools, sampling.stream are"),
    ({"max_completion_tokens": 5}, "unsupported_option: sampling.max_completion_tokens"),
    ({"temperature": "1"}, "bad_option: sampling.temperature must be a number >= 0, got '1'"),
    ({"temperature": float("nan")}, "bad_option: sampling.temperature"),
    ({"top_p": 1.5}, "bad_option: sampling.top_p must be a number in (0, 1], got 1.5"),
    ({"top_k": 0}, "bad_option: sampling.top_k must be an integer >= 1, or -1 (all), got 0"),
    ({"top_k": 2.0}, "bad_option: sampling.top_k must be an integer"),
    ({"min_p": -0.1}, "bad_option: sampling.min_p must be a number in [0, 1]"),
    ({"repetition_penalty": 0}, "bad_option: sampling.repetition_penalty must be a number in "
                                "(0, 2]"),
    ({"repetition_penalty": 3}, "bad_option: sampling.repetition_penalty"),
    ({"seed": "7"}, "bad_option: sampling.seed must be an integer, got '7'"),
    ({"stop": [""]}, "bad_option: sampling.stop must be a non-empty string or a list of at "
                     "most 32 of them"),
    ({"stop": ["s"] * 33}, "bad_option: sampling.stop must be a non-empty string or a list"),
    ({"stop": {"a": 1}}, "bad_option: sampling.stop"),
    ({"max_tokens": 0}, "bad_option: sampling.max_tokens must be a positive integer, got 0"),
    ({"max_tokens": True}, "bad_option: sampling.max_tokens must be a positive integer"),
    ({"n": 200}, "bad_option: sampling.n must be an integer in 1..128, got 200"),
    ({"temperature": "x" * 100}, "bad_option: sampling.temperature must be a number >= 0, "
                                 "got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx..."),
])
def test_a_bad_sampling_object_rejects_the_row_naming_the_option(sampling: Any,
                                                                 reason: str) -> None:
    row = row_with(sampling=sampling)
    assert isinstance(row, BadRow) and row.id == "r"
    assert row.reason.startswith(reason), row.reason


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}},
    '{ "type": "object",\n  "properties": {"b": {"type": "string"}, "a": {"type": "integer"}} }',
])
def test_a_json_schema_object_or_string_is_stored_as_compact_json_in_its_order(
        schema: Any) -> None:
    row = row_with(json_schema=schema)
    assert isinstance(row, Row)
    assert row.json_schema == ('{"type":"object","properties":{"b":{"type":"string"},'
                               '"a":{"type":"integer"}}}')
    assert orjson.loads(row.json_schema)["properties"]["a"] == {"type": "integer"}


def test_a_batch_line_may_carry_a_json_schema_too() -> None:
    row = parse_row(1, {"custom_id": "c", "body": {"prompt": "x"}, "json_schema": {"type": "x"}})
    assert isinstance(row, Row) and row.json_schema == '{"type":"x"}'


@pytest.mark.parametrize(("schema", "reason"), [
    ("[1, 2]", "bad_json_schema: json_schema must be a JSON object (or a string holding one), "
               "got list"),
    ("{not json", "bad_json_schema: json_schema is not valid JSON"),
    (5, "bad_json_schema: json_schema must be a JSON object"),
    ('"a string"', "bad_json_schema: json_schema must be a JSON object"),
])
def test_a_json_schema_that_is_not_an_object_rejects_the_row(schema: Any, reason: str) -> None:
    row = row_with(json_schema=schema)
    assert isinstance(row, BadRow) and row.reason.startswith(reason), row
