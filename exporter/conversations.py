"""`--format conversations`: each result as the conversation it answered with the answer as its
final assistant turn, the shape SFT and draft-model trainers read.

The turns keep the input's style: `role`/`content` (a `messages` row, a Batch body, or
`conversations` with roles) or `from`/`value` (ShareGPT, the answer from "gpt"); a `prompt`
becomes a user turn under `messages`. With `--reasoning keep` the answer turn carries its
reasoning as `reasoning_content` (the field Qwen3 and DeepSeek chat templates render into a
think block, so a trainer applying the template sees it), `inline` writes that block into the
content, `strip` leaves it out. Each line also holds `id`, `finish_reason` (filter out
`length`: a cut-off answer), `sample` for a row asked for several times, and the input row's
own other fields.
"""

from __future__ import annotations

from typing import Any, BinaryIO

import orjson

from exporter import shape
from exporter.source import OutputDir
from fleetgen.base.contract import KIND_RESULT


def conversation_row(record: dict[str, Any], reasoning: str) -> dict[str, Any]:
    key, turns = shape.conversation(record)
    content, thought = shape.answer(record, reasoning)
    if shape.is_sharegpt(turns):
        turn: dict[str, Any] = {"from": shape.SHAREGPT_ANSWER, "value": content}
    else:
        turn = {"role": "assistant", "content": content}
    if thought is not None:
        turn["reasoning_content"] = thought
    row: dict[str, Any] = {"id": record["id"], key: [*turns, turn]}
    row.update(shape.row_fields(record))
    if record.get("sample") is not None:
        row["sample"] = record["sample"]
    row["finish_reason"] = record.get("finish_reason")
    return row


def write(source: OutputDir, out: BinaryIO, reasoning: str) -> tuple[int, int]:
    """Every result, in input order; returns (lines written, outcomes superseded)."""
    index = source.index((KIND_RESULT,))
    written = 0
    for group in index.groups():
        for outcome in group:
            out.write(orjson.dumps(conversation_row(outcome.record, reasoning)) + b"\n")
            written += 1
    return written, index.superseded
