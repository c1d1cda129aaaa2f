"""Reading rows: every input shape, carried fields, derived ids, bad rows with line numbers."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetgen.errors import InputError
from producer.rows import BadRow, Row, parse_line, read_rows
from tests.support.pipeline import write_lines


def rows_of(path: Path) -> list[Row | BadRow]:
    return list(read_rows(path))


def test_messages_row_keeps_other_fields(tmp_path: Path) -> None:
    f = write_lines(tmp_path / "in.jsonl", [
        '{"id": "a", "messages": [{"role": "user", "content": "hi"}], "lang": "en", "n": 3}'])
    [row] = rows_of(f)
    assert isinstance(row, Row)
    assert row.id == "a" and row.line == 1
    assert row.messages == [{"role": "user", "content": "hi"}]
    assert row.fields["lang"] == "en" and row.fields["n"] == 3 and "id" not in row.fields


def test_sharegpt_conversations_map_roles_and_drop_trailing_answer(tmp_path: Path) -> None:
    f = write_lines(tmp_path / "in.jsonl", [
        '{"id": "s", "conversations": [{"from": "system", "value": "be nice"}, '
        '{"from": "human", "value": "q"}, {"from": "gpt", "value": "old"}]}'])
    [row] = rows_of(f)
    assert isinstance(row, Row)
    assert row.messages == [{"role": "system", "content": "be nice"},
                            {"role": "user", "content": "q"}]


def test_role_content_conversations(tmp_path: Path) -> None:
    f = write_lines(tmp_path / "in.jsonl", [
        '{"id": "r", "conversations": [{"role": "user", "content": "a"}, '
        '{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}'])
    [row] = rows_of(f)
    assert isinstance(row, Row) and row.messages is not None
    assert [m["role"] for m in row.messages] == ["user", "assistant", "user"]


def test_raw_prompt_and_derived_id_is_deterministic(tmp_path: Path) -> None:
    f = write_lines(tmp_path / "in.jsonl", ['{"prompt": "Q: 1+1?\\nA:"}', '{"prompt": "other"}'])
    first, second = rows_of(f), rows_of(f)
    assert isinstance(first[0], Row) and first[0].prompt == "Q: 1+1?\nA:"
    assert first[0].id == second[0].id and first[0].id.startswith("row-")
    assert first[0].id != first[1].id


def test_integer_id_becomes_string(tmp_path: Path) -> None:
    [row] = rows_of(write_lines(tmp_path / "in.jsonl", ['{"id": 7, "prompt": "x"}']))
    assert isinstance(row, Row) and row.id == "7"


@pytest.mark.parametrize(("line", "reason"), [
    ('{"id": "x", "messages": [', "invalid_json"),
    ('["a"]', "not_an_object"),
    ('{"id": "x"}', "no_prompt"),
    ('{"id": "x", "messages": []}', "empty_messages"),
    ('{"id": "x", "messages": "hello"}', "bad_messages"),
    ('{"id": "x", "messages": [{"role": "user", "content": 5}]}', "bad_messages"),
    ('{"id": "x", "conversations": [{"from": "alien", "value": "?"}]}', "bad_conversations"),
    ('{"id": "x", "conversations": [{"from": "gpt", "value": "only an answer"}]}',
     "empty_conversations"),
    ('{"id": [1], "prompt": "x"}', "bad_id"),
    ('{"id": "", "prompt": "x"}', "bad_id"),
    ('{"id": "x", "prompt": 5}', "bad_prompt"),
    ('{"id": "x", "prompt": "   "}', "empty_prompt"),
    # One rule for every shape: the turn to answer has no text.
    ('{"id": "x", "messages": [{"role": "user", "content": ""}]}', "empty_prompt"),
    ('{"id": "x", "messages": [{"role": "system", "content": "Be brief."}, '
     '{"role": "user", "content": " \\n"}, {"role": "assistant", "content": "old"}]}',
     "empty_prompt"),
    ('{"id": "x", "messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}',
     "empty_prompt"),
    ('{"id": "x", "conversations": [{"from": "human", "value": ""}]}', "empty_prompt"),
])
def test_bad_rows_are_rejected_with_line_number_and_reason(tmp_path: Path, line: str,
                                                           reason: str) -> None:
    f = write_lines(tmp_path / "in.jsonl", ['{"id": "ok", "prompt": "fine"}', line])
    good, bad = rows_of(f)
    assert isinstance(good, Row)
    assert isinstance(bad, BadRow) and bad.line == 2 and bad.reason.startswith(reason)


def test_invalid_utf8_and_empty_lines(tmp_path: Path) -> None:
    f = tmp_path / "in.jsonl"
    f.write_bytes(b'{"id": "a", "prompt": "\xff\xfe"}\n\n{"id": "b", "prompt": "ok"}\n')
    bad, empty, good = rows_of(f)
    assert isinstance(bad, BadRow) and bad.reason.startswith("invalid_utf8") and bad.line == 1
    assert isinstance(empty, BadRow) and empty.line == 2
    assert isinstance(good, Row) and good.line == 3


def test_empty_file_has_no_rows(tmp_path: Path) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_bytes(b"")
    assert rows_of(f) == []


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        rows_of(tmp_path / "nope.jsonl")


def test_parquet_rows(tmp_path: Path) -> None:
    table = pa.table({"id": ["p1", "p2"], "prompt": ["hello", "world"], "tag": ["x", "y"]})
    pq.write_table(table, tmp_path / "in.parquet")
    rows = rows_of(tmp_path / "in.parquet")
    assert [r.id for r in rows] == ["p1", "p2"]
    assert isinstance(rows[1], Row) and rows[1].line == 2 and rows[1].fields["tag"] == "y"


def test_parquet_with_wrong_columns_is_an_input_error(tmp_path: Path) -> None:
    pq.write_table(pa.table({"question": ["q"]}), tmp_path / "in.parquet")
    with pytest.raises(InputError, match="none of the columns"):
        rows_of(tmp_path / "in.parquet")


def test_a_bad_json_line_is_shown_where_it_breaks() -> None:
    bad = parse_line(4, b'{"id": "x", "prompt": "' + b"a" * 300 + b'" oops}')
    assert isinstance(bad, BadRow) and bad.reason.startswith("invalid_json: ")
    near = bad.reason.split("; near: ", 1)[1]
    assert near.startswith("…") and near.endswith('" oops}') and len(near) == 61
