"""`--format conversations`: each result as the conversation it answered with the answer as its
final assistant turn, in the shape SpecForge (the SGLang team's drafter trainer) reads and
writes, which SFT trainers read too.

The shape follows SpecForge's `scripts/regenerate_train_data.py` `call_sglang`: its output row
is the input row with `conversations` set to the regenerated turns, each `{role, content}` with
`reasoning_content` on an assistant turn when the reasoning is saved apart, and `status` set to
"success". Its trainer loads the file with `load_dataset("json", ...)`
(`specforge/data/prompt_builder.py` `_prepare_raw_prompts`), wants a `conversations` column
(`specforge/data/preprocessing.py` `build_eagle3_dataset`: "Expected 'conversations' column")
and passes each turn's `role`, `content` and `reasoning_content` to the chat template
(`specforge/data/parse.py` `ThinkingParser.standard_keys`); its validator
(`scripts/validate_regenerated_data.py` `validate_row`) wants a non-empty string `id`,
`status == "success"`, user/assistant turns with string content ending on the assistant.

So every input shape becomes `conversations` of role/content turns: a `messages` row, a Batch
line's body, ShareGPT `from`/`value` turns (human/gpt/system turned into user/assistant/system),
and a raw `prompt` as one user turn. With `--reasoning keep` the answer turn carries its
reasoning as `reasoning_content` (the field Qwen3 and DeepSeek chat templates render into a
think block); `inline` writes that block into the content, `strip` leaves it out. Each line
also holds `id`, the input row's own other fields (as SpecForge keeps them), `sample` for a row
asked for several times, `finish_reason`, and `status`. `--only-finished` leaves out answers cut
at their budget or inside their reasoning (fleetgen/exporter/finished.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import orjson

from fleetgen.base.contract import KIND_RESULT
from fleetgen.exporter import shape
from fleetgen.exporter.finished import Selection
from fleetgen.exporter.source import OutputDir

COLUMN = "conversations"
STATUS = "success"  # SpecForge's mark of a regenerated row; every exported row is a result


def conversation_row(record: dict[str, Any], reasoning: str) -> dict[str, Any]:
    _, turns = shape.conversation(record)
    content, thought = shape.answer(record, reasoning)
    turn: dict[str, Any] = {"role": "assistant", "content": content}
    if thought is not None:
        turn["reasoning_content"] = thought
    row: dict[str, Any] = {"id": record["id"],
                           COLUMN: [*(shape.role_turn(t) for t in turns), turn]}
    row.update(shape.row_fields(record))
    if record.get("sample") is not None:
        row["sample"] = record["sample"]
    row["finish_reason"] = record.get("finish_reason")
    row["status"] = STATUS
    return row


def regenerated_row(records: list[dict[str, Any]], reasoning: str) -> dict[str, Any]:
    """A `--turns all` conversation as regenerated: its user turns, each followed by the answer
    this run generated for it (the input's own answers discarded), for the turns 1..k given."""
    _, turns = shape.conversation(records[0])
    asked = shape.user_turns([shape.role_turn(t) for t in turns])
    messages: list[dict[str, Any]] = []
    for record, question in zip(records, asked, strict=False):
        content, thought = shape.answer(record, reasoning)
        answer: dict[str, Any] = {"role": "assistant", "content": content}
        if thought is not None:
            answer["reasoning_content"] = thought
        messages += [*question, answer]
    row: dict[str, Any] = {"id": records[0]["id"], COLUMN: messages}
    row.update(shape.row_fields(records[0], turns_all=True))
    if records[0].get("sample") is not None:
        row["sample"] = records[0]["sample"]
    row["turns"] = len(records)
    row["finish_reason"] = records[-1].get("finish_reason")
    row["status"] = STATUS
    return row


def rows(outcomes: list[Any], reasoning: str, selection: Selection,
         turns_all: bool = False) -> Iterator[dict[str, Any]]:
    """The rows of one input line: one per result, or with --turns all one per conversation
    (sample), holding its turns from the first up to the first that is missing (rejected,
    failed, or left out by `selection`: later turns were built on it)."""
    conversations: dict[Any, list[dict[str, Any] | None]] = {}
    for outcome in outcomes:
        record = outcome.record
        if not turns_all:
            if selection.admit(record):
                yield conversation_row(record, reasoning)
            continue
        turns = conversations.setdefault(record.get("sample"), [])
        if len(turns) == int(record["turn"]) - 1 and (not turns or turns[-1] is not None):
            turns.append(record if selection.admit(record) else None)
    for turns in conversations.values():
        whole = turns[:turns.index(None)] if None in turns else turns
        if whole:
            yield regenerated_row([t for t in whole if t is not None], reasoning)


def write(source: OutputDir, out: BinaryIO, reasoning: str,
          selection: Selection | None = None) -> tuple[int, int]:
    """Every result (every finished one, by `selection`), in input order; returns (lines
    written, outcomes superseded)."""
    selection = selection or Selection()
    index = source.index((KIND_RESULT,))
    written = 0
    for group in index.groups():
        for row in rows(group, reasoning, selection, source.info.turns_all):
            out.write(orjson.dumps(row) + b"\n")
            written += 1
    return written, index.superseded


def write_parquet(source: OutputDir, out: BinaryIO, reasoning: str,
                  selection: Selection | None = None) -> tuple[int, int]:
    """The same rows as a Parquet table (`conversations` a list of structs); returns (rows
    written, outcomes superseded)."""
    from fleetgen.exporter import parquet

    return parquet.write_rows(source, out, lambda record: conversation_row(record, reasoning),
                              selection or Selection(), always=("id",))
