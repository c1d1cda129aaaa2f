"""Result records: the input row flat beside fleetgen's fields, and `split_result`, the one
reading of which keys are which, giving the row back exactly whatever its field names."""

from __future__ import annotations

from typing import Any

import orjson

from fleetgen.queue.contract import TaskPayload, request_key, slot_of
from fleetgen.records.outcomes import (
    RESULT_FIELDS,
    SHADOWED,
    Generation,
    quality_counts,
    result_record,
    split_result,
)
from fleetgen.records.reasoning import THINK_END_ID, THINK_START_ID

SCHEMA = orjson.dumps({"type": "object"}).decode()
# Every option that adds a field of fleetgen's to a result, all at once.
EVERY_OPTION: dict[str, Any] = {
    "sample": 1, "slot": 8, "turn": 2, "turns": 3, "file": "b.jsonl", "position": 4,
    "think": True, "json_schema": SCHEMA, "token_ids": True}


def payload(row: dict[str, Any], **options: Any) -> TaskPayload:
    base = TaskPayload(run="r", line=3, id="x", input_ids=[1, 2], max_tokens=50, sampling={},
                       row=row)
    base.update(options)  # type: ignore[typeddict-item]
    return base


def answer(logprobs: bool = False) -> Generation:
    ids = [THINK_START_ID, 11, THINK_END_ID, 12]
    return Generation(text="<think>\nhmm\n</think>\n\n{}", finish_reason="stop",
                      prompt_tokens=2, completion_tokens=len(ids), cached_tokens=0,
                      latency_s=0.1, output_ids=ids,
                      logprobs={"ids": ids, "lp": [-0.5] * 4} if logprobs else None)


def record_of(row: dict[str, Any], **options: Any) -> dict[str, Any]:
    # Through JSON, as the drainer writes it and every reader gets it back.
    record = result_record(payload(row, **options), answer(logprobs=True), max_tokens=50,
                           attempts=1, worker="gpu0@h")
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(record))
    return loaded


def test_every_field_fleetgen_writes_is_one_of_its_named_fields() -> None:
    row = {"messages": [{"role": "user", "content": "hi"}], "topic": "t"}
    record = record_of(row, **EVERY_OPTION)
    assert set(record) - set(row) <= RESULT_FIELDS
    parts = split_result(record)
    assert parts.row == row
    assert parts.fleetgen == {k: v for k, v in record.items() if k not in row}


def test_a_row_without_clashes_is_flat_beside_fleetgens_fields() -> None:
    """The file format users read: the row's fields at the top level, nothing nested."""
    row = {"prompt": "Once", "source": "mix", "tags": ["a"]}
    record = record_of(row)
    assert SHADOWED not in record
    assert {k: record[k] for k in row} == row
    assert record["id"] == "x" and record["line"] == 3 and record["finish_reason"] == "stop"


def test_a_row_field_named_like_one_of_fleetgens_is_kept_whole_beside_it() -> None:
    """Ours stay what they say (the answer, the request's slot), the row's are not lost, and
    no reader mistakes the row's for ours: a `slot` is not the request's bit in the run's
    bitmaps, a `reasoning` not the model's, a `json_valid` not counted, a `turn` not a turn
    of `--turns all`."""
    row = {"messages": [{"role": "user", "content": "hi"}], "completion": "the reference",
           "slot": 99, "sample": "s", "turn": 7, "line": "l", "reasoning": "theirs",
           "json_valid": False, SHADOWED: {"nested": True}, "topic": "t"}
    record = record_of(row)  # a plain run: no reasoning split, no schema, one sample
    assert record["completion"] == "<think>\nhmm\n</think>\n\n{}" and record["line"] == 3
    for name in ("slot", "sample", "turn", "reasoning", "json_valid"):
        assert name not in record, name
    assert slot_of(record) == 3 and request_key(record) == "x"
    assert quality_counts(record)["json_invalid"] == 0
    assert record["topic"] == "t" and record[SHADOWED] == {
        k: v for k, v in row.items() if k not in ("messages", "topic")}
    parts = split_result(record)
    assert parts.row == row
    assert parts.fleetgen["completion"] == record["completion"]
    assert SHADOWED not in parts.fleetgen


def test_the_split_gives_the_row_back_with_every_option_on() -> None:
    row = {"messages": [], "reasoning": "theirs", "slot": "x", "output_ids": [1]}
    record = record_of(row, **EVERY_OPTION)
    assert (record["reasoning"], record["slot"], record["output_ids"]) == (
        "hmm", 8, [THINK_START_ID, 11, THINK_END_ID, 12])
    assert split_result(record).row == row
