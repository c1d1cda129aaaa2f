"""`--format tokens`: one line per answer (row x sample), `{id, sample?, input_ids, loss_mask,
finish_reason}`, the pre-tokenized rows drafter trainers read instead of re-rendering text.

`input_ids` is the prompt exactly as it was sent, then the answer's generated ids
(`output_ids`, kept by `fleetgen produce --token-ids`); `loss_mask` is 0 over the prompt and 1
over the answer, as vLLM speculators builds its rows (scripts/response_regeneration/script.py
`build_boundary_sample`: `[0] * len(prompt_token_ids) + [1] * len(completion_token_ids)`). The
shape is what their loaders accept as it is: speculators' `prepare_data.py`
(src/speculators/data_generation/preprocessing.py `_passthrough_pretokenized`: both columns,
equal lengths; every other column is dropped) and SpecForge's `prompts_path`
(specforge/data/prompt_builder.py `_prompt_from_record`: one-dimensional integer lists,
`loss_mask` of 0 and 1 only, equal lengths, not empty). tests/support/trainers.py holds those
checks, copied, and runs them over every export.

The prompt ids are not stored in results (they would double the file); they are rendered
again from the row and the run's settings by a `PromptIds` the caller builds (the CLI, from
the producer's own rendering: the exporter does not import the producer), and checked
against the record's `prompt_tokens`, which the engine counted from the ids it was sent, and
its `prompt_ids_digest` of those ids (fleetgen/records/outcomes.py `ids_digest`).

Parquet instead of JSONL when the output's name ends in `.parquet`: the same columns,
`input_ids` list<int32>, `loss_mask` list<int8>.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import orjson
import pyarrow as pa

from fleetgen.errors import ConfigError, InputError
from fleetgen.exporter import shape
from fleetgen.exporter.finished import Selection, unfinished
from fleetgen.exporter.parquet import write_row_groups
from fleetgen.exporter.source import DrainedRun
from fleetgen.queue.contract import KIND_RESULT
from fleetgen.records.outcomes import ids_digest
from fleetgen.records.outdir import SUMMARY

PARQUET_SUFFIX = ".parquet"
SCHEMA = pa.schema([("id", pa.string()), ("sample", pa.int64()),
                    ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                    ("finish_reason", pa.string()), ("unfinished", pa.string())])
# A --turns all run's lines say which turn they are (one line per turn).
TURNS_SCHEMA = SCHEMA.insert(2, pa.field("turn", pa.int64()))
GROUP_TOKENS = 4 << 20  # tokens per Parquet row group (about 20 MB in memory)


# The ids the producer sent for a result's row (the record): its messages (or prompt)
# rendered with the run's tokenizer and template settings, then tokenized; ValueError when the
# row cannot be rendered.
PromptIds = Callable[[Mapping[str, Any]], list[int]]

# Builds the PromptIds of a run from its settings (summary.json `settings`).
PromptIdsFactory = Callable[[Mapping[str, Any]], PromptIds]


def prompt_ids_for(settings: Mapping[str, Any] | None, run: str,
                   factory: PromptIdsFactory | None) -> PromptIds:
    """The run's PromptIds, or a ConfigError (one line, exit 3) when the run cannot be
    exported as tokens."""
    if settings is None:
        raise ConfigError(f"run {run!r}: {SUMMARY} holds no run settings (a drainer from "
                          "before --token-ids wrote it, or none yet); run `fleetgen drain` on "
                          "the directory to write it, then export again")
    if not settings.get("token_ids"):
        raise ConfigError(f"run {run!r} was produced without --token-ids: its results hold no "
                          "output token ids; generate it again with --token-ids (`fleetgen "
                          "produce` with a new --run name, `fleetgen demo` with another --out)")
    if factory is None:
        raise ConfigError("--format tokens needs a prompt renderer (the CLI builds one)")
    return factory(settings)


def token_row(record: Mapping[str, Any], prompt: list[int]) -> dict[str, Any]:
    """One answer as a pre-tokenized training row; InputError naming the row when the
    record does not fit the prompt re-rendered for it."""
    where = _where(record)
    output = record.get("output_ids")
    if not isinstance(output, list):
        raise InputError(f"{where} has no output_ids; was it produced with --token-ids?")
    digest = record.get("prompt_ids_digest")
    if len(prompt) != record.get("prompt_tokens") or (digest is not None
                                                      and digest != ids_digest(prompt)):
        raise InputError(
            f"{where}: its prompt renders to other ids now ({len(prompt)} tokens; the engine "
            f"counted {record.get('prompt_tokens')}): the tokenizer, its chat template or the "
            "row changed since the run (or the server counts differently); export with the "
            "run's tokenizer")
    row: dict[str, Any] = {"id": record["id"]}
    if record.get("sample") is not None:
        row["sample"] = record["sample"]
    row["input_ids"] = prompt + output
    row["loss_mask"] = [0] * len(prompt) + [1] * len(output)
    row["finish_reason"] = record.get("finish_reason")
    why = unfinished(dict(record))
    if why is not None:  # kept by --include-unfinished: say why it is not a whole answer
        row["unfinished"] = why
    return row


def write(source: DrainedRun, out: BinaryIO, prompt_ids: PromptIds,
          parquet: bool = False, selection: Selection | None = None) -> tuple[int, int]:
    """Every result (the finished ones under --only-finished), in input order, as JSONL (or
    Parquet); returns (lines written, outcomes superseded)."""
    index = source.index((KIND_RESULT,))
    rows = _rows(index.groups(), prompt_ids, selection or Selection(), source.info.turns_all)
    schema = TURNS_SCHEMA if source.info.turns_all else SCHEMA
    written = _write_parquet(rows, out, schema) if parquet else _write_jsonl(rows, out)
    return written, index.superseded


def _rows(groups: Iterator[list[Any]], prompt_ids: PromptIds, selection: Selection,
          turns_all: bool = False) -> Iterator[dict[str, Any]]:
    for group in groups:
        prompt: list[int] | None = None  # a row's samples share their prompt
        earlier: dict[Any, list[dict[str, Any]]] = {}  # --turns all: by sample, turns so far
        for outcome in group:
            record = outcome.record
            if turns_all:
                before = earlier.setdefault(record.get("sample"), [])
                before.append(record)
                if selection.admit(record):
                    row = token_row(record, _prompt(turn_record(before), prompt_ids))
                    yield {"id": row.pop("id"), **({"sample": row.pop("sample")}
                                                   if "sample" in row else {}),
                           "turn": record["turn"], **row}
                continue
            if not selection.admit(record):
                continue
            if prompt is None:
                prompt = _prompt(record, prompt_ids)
            yield token_row(record, prompt)


def turn_record(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """The last of these results (turns 1..k of one conversation) as a row whose `messages`
    are turn k's prompt as it was sent: the user turns with this run's answers between them
    (the producer's producer/turns.py `turn_messages`), the input's own answers discarded."""
    record = turns[-1]
    if [int(t["turn"]) for t in turns] != list(range(1, len(turns) + 1)):
        raise InputError(f"{_where(record)}: turn {record['turn']} is written but an earlier "
                         "turn of its conversation is not")
    _, given = shape.conversation(record)
    asked = shape.user_turns([shape.role_turn(t) for t in given])
    messages: list[Any] = []
    for question, answer in zip(asked, turns[:-1], strict=False):
        reply = {"role": "assistant", "content": str(answer.get("completion") or "")}
        if isinstance(answer.get("reasoning"), str):
            reply["reasoning_content"] = answer["reasoning"]
        messages += [*question, reply]
    messages += asked[len(turns) - 1] if len(turns) <= len(asked) else []
    row = {k: v for k, v in record.items() if k not in shape.CONVERSATION_FIELDS}
    row["messages"] = messages
    return row


def _prompt(record: Mapping[str, Any], prompt_ids: PromptIds) -> list[int]:
    try:
        return prompt_ids(record)
    except ValueError as exc:
        raise InputError(f"{_where(record)}: its prompt cannot be rendered again: {exc}") from exc


def _write_jsonl(rows: Iterator[dict[str, Any]], out: BinaryIO) -> int:
    written = 0
    for row in rows:
        out.write(orjson.dumps(row) + b"\n")
        written += 1
    return written


def _write_parquet(rows: Iterator[dict[str, Any]], out: BinaryIO,
                   schema: pa.Schema = SCHEMA) -> int:
    return write_row_groups(out, schema, _by_tokens(rows))


def _by_tokens(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """The rows in batches of about GROUP_TOKENS ids each (the last one the rest)."""
    batch: list[dict[str, Any]] = []
    tokens = 0
    for row in rows:
        batch.append(row)
        tokens += len(row["input_ids"])
        if tokens >= GROUP_TOKENS:
            yield batch
            batch, tokens = [], 0
    yield batch


def _where(record: Mapping[str, Any]) -> str:
    sample = record.get("sample")
    return f"row {record.get('id')!r} (input line {record.get('line')}" + \
        (f", sample {sample})" if sample is not None else ")")
