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
line's body, ShareGPT `from`/`value` turns (human/gpt/system turned into user/assistant/system).
With `--reasoning keep` the answer turn carries its reasoning as `reasoning_content` (the field
Qwen3 and DeepSeek chat templates render into a think block); `inline` writes that block into
the content, `strip` leaves it out. Each line also holds `id`, the input row's own other fields
(as SpecForge keeps them), `sample` for a row asked for several times, `finish_reason`, and
`status`.

What a trainer needs to render the line as the model saw it (the figures
SpecForge's and speculators' own code measured on these lines are in docs/training.md):
- `chat_template_kwargs`: the template options the prompt was rendered with (the run's, the
  row's own over them), and each of them again as a column of its own: SpecForge passes every
  column but `conversations`, `id` and `tools` to the chat template as a keyword
  (`specforge/data/preprocessing.py` `build_eagle3_dataset`, `**examples`), so a
  `preserve_thinking` history renders as it was sent; `thinking`: whether the model reasoned.
- A raw `prompt` row was sent without a template: its line holds `prompt` and `completion` and
  `conversations: null`, which both trainers skip (SpecForge's `preprocess_conversations`
  `if not source`, speculators' `_render_conversation_rows`) rather than wrap it in a chat turn.
- One line per generated answer, ending with it: with `--turns all` one line per regenerated
  turn (`turn`), its history this run's earlier answers as they were sent, so a trainer that
  learns only the last assistant span (SpecForge `train_only_last_turn`) learns every answer
  once, in the context the model had. The dataset's own earlier answers (`--turns last`) carry
  `generated: false`: the model did not write them.
- Unfinished answers (cut at their budget, stopped inside their reasoning, empty) are left out,
  counted by reason; `--include-unfinished` keeps them with `status: "unfinished"` and the
  reason in `unfinished` (fleetgen/exporter/finished.py): no trainer should close them with an
  end of turn the model never wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import orjson

from fleetgen.exporter import shape, tokens
from fleetgen.exporter.finished import Selection, unfinished
from fleetgen.exporter.source import DrainedRun
from fleetgen.queue.contract import KIND_RESULT

COLUMN = "conversations"
STATUS = "success"  # SpecForge's mark of a regenerated row
UNFINISHED = "unfinished"  # the status of an answer kept by --include-unfinished
OWN_COLUMNS = frozenset({"id", COLUMN, "sample", "turn", "finish_reason", "status",
                              "unfinished", "thinking", "chat_template_kwargs", "prompt",
                              "completion", "reasoning_content"})


def template_options(record: dict[str, Any], run_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The chat template options the row's prompt was rendered with: the run's, the row's own
    `chat_template_kwargs` over them (producer/prompts.py `render_row`)."""
    own = record.get("chat_template_kwargs")
    return {**run_kwargs, **(own if isinstance(own, dict) else {})}


def thought(record: dict[str, Any]) -> bool | None:
    """Whether the model reasoned: its answer has reasoning split out (or stopped inside it);
    None when the record cannot say (a run that did not split reasoning writes no field)."""
    if "reasoning" not in record:
        return None
    return isinstance(record["reasoning"], str) or record.get("reasoning_unfinished") is True


def _answer_turn(record: dict[str, Any], reasoning: str) -> dict[str, Any]:
    content, reasoned = shape.answer(record, reasoning)
    turn: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoned is not None:
        turn["reasoning_content"] = reasoned
    return turn


def _finish(row: dict[str, Any], record: dict[str, Any], options: dict[str, Any],
            turns_all: bool) -> dict[str, Any]:
    """The fields every line ends with: the input row's own, the sample and turn, the
    template options (and each as a column), whether it thought, and its status."""
    for key, value in shape.row_fields(record).items():
        row.setdefault(key, value)
    if record.get("sample") is not None:
        row["sample"] = record["sample"]
    if turns_all:
        row["turn"] = record["turn"]
    row["chat_template_kwargs"] = options
    for key, value in options.items():
        if key not in OWN_COLUMNS:
            row[key] = value
    thinking = thought(record)
    if thinking is not None:
        row["thinking"] = thinking
    row["finish_reason"] = record.get("finish_reason")
    why = unfinished(record)
    row["status"] = STATUS if why is None else UNFINISHED
    if why is not None:
        row["unfinished"] = why
    return row


def conversation_row(record: dict[str, Any], reasoning: str,
                     run_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `--turns last` answer: the input's turns (its own answers marked `generated:
    false`), then the answer; a raw prompt as `prompt` and `completion`, no conversation."""
    options = template_options(record, run_kwargs or {})
    row: dict[str, Any] = {"id": record["id"]}
    source = record["body"] if shape.is_batch_row(record) else record
    if shape.endpoint(record) == shape.COMPLETIONS_URL and "prompt" in source:
        content, reasoned = shape.answer(record, reasoning)
        row.update({COLUMN: None, "prompt": shape.prompt_text(source["prompt"]),
                    "completion": content})
        if reasoned is not None:
            row["reasoning_content"] = reasoned
        return _finish(row, record, options, False)
    _, turns = shape.conversation(record)
    history = [shape.role_turn(t) for t in turns]
    history = [{**t, "generated": False} if shape.is_assistant(t) else t for t in history]
    row[COLUMN] = [*history, _answer_turn(record, reasoning)]
    return _finish(row, record, options, False)


def turn_row(turns: list[dict[str, Any]], reasoning: str,
             run_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Turn k of a `--turns all` conversation (the results of its turns 1..k): the messages
    turn k was sent (the user turns, this run's answers 1..k-1 between them, the input's own
    discarded), then its answer."""
    record = turns[-1]
    options = template_options(record, run_kwargs or {})
    sent = tokens.turn_record(turns)["messages"]
    row: dict[str, Any] = {"id": record["id"], COLUMN: [*sent, _answer_turn(record, reasoning)]}
    return _finish(row, record, options, True)


def rows(outcomes: list[Any], reasoning: str, selection: Selection,
         turns_all: bool = False, run_kwargs: dict[str, Any] | None = None
         ) -> Iterator[dict[str, Any]]:
    """The rows of one input line: one per result (with --turns all, one per regenerated
    turn, whose history is the turns before it in its conversation, whether or not they are
    exported themselves: the model saw them)."""
    earlier: dict[Any, list[dict[str, Any]]] = {}  # --turns all: by sample, the turns so far
    for outcome in outcomes:
        record = outcome.record
        if not turns_all:
            if selection.admit(record):
                yield conversation_row(record, reasoning, run_kwargs)
            continue
        before = earlier.setdefault(record.get("sample"), [])
        before.append(record)
        if selection.admit(record):
            yield turn_row(before, reasoning, run_kwargs)


def run_kwargs_of(source: DrainedRun) -> dict[str, Any]:
    """The run's --chat-template-kwargs (summary.json `settings`)."""
    settings = (source.info.summary or {}).get("settings") or {}
    kwargs = settings.get("chat_template_kwargs")
    return dict(kwargs) if isinstance(kwargs, dict) else {}


def write(source: DrainedRun, out: BinaryIO, reasoning: str,
          selection: Selection | None = None) -> tuple[int, int]:
    """Every result (every finished one, by `selection`), in input order; returns (lines
    written, outcomes superseded)."""
    selection = selection or Selection()
    index = source.index((KIND_RESULT,))
    run_kwargs = run_kwargs_of(source)
    written = 0
    for group in index.groups():
        for row in rows(group, reasoning, selection, source.info.turns_all, run_kwargs):
            out.write(orjson.dumps(row) + b"\n")
            written += 1
    return written, index.superseded


def write_parquet(source: DrainedRun, out: BinaryIO, reasoning: str,
                  selection: Selection | None = None) -> tuple[int, int]:
    """The same rows as a Parquet table (`conversations` a list of structs); returns (rows
    written, outcomes superseded)."""
    from fleetgen.exporter import parquet

    run_kwargs = run_kwargs_of(source)

    def table_row(record: dict[str, Any]) -> dict[str, Any]:
        row = conversation_row(record, reasoning, run_kwargs)
        if not row["chat_template_kwargs"]:  # Parquet has no struct without fields
            del row["chat_template_kwargs"]
        return row

    return parquet.write_rows(source, out, table_row, selection or Selection(),
                              always=("id",))
