"""Outcome records (pure): what a result, failure or rejection holds, and the stream entry
that carries it from the producer or a worker to the drainer."""

from __future__ import annotations

import hashlib
import sys
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import orjson

from fleetgen.errors import EngineError
from fleetgen.queue.contract import TaskPayload
from fleetgen.records.reasoning import split_reasoning
from fleetgen.records.structured import json_error

# The fields that name which request of its row a task payload, and each record of its
# outcome, is (`request_fields`), and where the row is in a run of several input files: the
# producer writes them into the payload and the records it writes itself, the worker's records
# copy them from the payload.
REQUEST_FIELDS: Final = ("sample", "slot", "turn", "turns")
PLACE_FIELDS: Final = ("file", "position")
_REQUEST_FIELDS = (*REQUEST_FIELDS, *PLACE_FIELDS)
# A result line is flat for its readers: fleetgen's fields and the input row's side by side
# (docs/design.md "Result records"). These names are fleetgen's in every result, whether or not
# this one carries them (`reasoning` only when the run splits reasoning, `turn` only with
# `--turns all`, ...); every other top-level key is the input row's own, carried through.
# A row field with one of these names is kept whole under SHADOWED, never overwritten or
# mistaken for fleetgen's (a row's `slot` read as its bit in the run's bitmaps, its
# `reasoning` exported as the model's), so `split_result` gives the row back exactly.
SHADOWED: Final = "shadowed"
RESULT_FIELDS: Final = frozenset({
    "id", "completion", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
    "max_tokens", "latency_s", "attempts", "worker", "line", "reasoning", "reasoning_tokens",
    "reasoning_unfinished", "logprobs", "json_valid", "json_error", "output_ids",
    "prompt_ids_digest", "finished_at", "slots", "spec", "spec_counters", "reused",
    *_REQUEST_FIELDS, SHADOWED})


class ResultParts(NamedTuple):
    """A result record taken apart: fleetgen's fields (with `id`, the row's key, as vLLM's
    BatchRequestOutput keeps `custom_id` beside the response), and the input row's own fields
    as the producer read them (less `id`: the task payload's `row`)."""

    fleetgen: dict[str, Any]
    row: dict[str, Any]


def carry_row(row: dict[str, Any]) -> dict[str, Any]:
    """The start of a result record: the input row's fields, flat, those named like one of
    fleetgen's under SHADOWED (absent when there are none)."""
    record = {k: v for k, v in row.items() if k not in RESULT_FIELDS}
    shadowed = {k: v for k, v in row.items() if k in RESULT_FIELDS}
    if shadowed:
        record[SHADOWED] = shadowed
    return record


def split_result(record: Mapping[str, Any]) -> ResultParts:
    """The one reading of which keys of a result are fleetgen's and which the row's:
    `split_result(result_record(payload, ...)).row == payload["row"]`."""
    fleetgen = {k: v for k, v in record.items() if k in RESULT_FIELDS and k != SHADOWED}
    row = {k: v for k, v in record.items() if k not in RESULT_FIELDS}
    shadowed = record.get(SHADOWED)
    if isinstance(shadowed, dict):
        row.update(shadowed)
    return ResultParts(fleetgen, row)


# A stream entry is two fields: the kind, and the record as orjson bytes. The drainer writes
# those bytes to the file as they came, so a record is serialised exactly once.
FIELD_KIND = "k"
FIELD_DATA = "d"
_KIND_B = FIELD_KIND.encode()
_DATA_B = FIELD_DATA.encode()


@dataclass(frozen=True)
class Generation:
    """A finished answer from an engine, whatever its protocol."""

    text: str
    finish_reason: str  # stop | length
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float
    output_ids: list[int] | None = None  # the generated token ids, where the engine gives them
    # Top-K log-probabilities per output token, compact (fleetgen/records/logprobs.py), when asked.
    logprobs: dict[str, Any] | None = None
    # The stop string that ended the answer, where the engine says: the text ends before it,
    # the output ids run through it (SGLang `trim_matched_stop` cuts the text only).
    stop_matched: str | None = None
    # Speculative decoding's figures for this answer (fleetgen/drainer/acceptance.py SPEC_KEYS:
    # verify_ct, accept_length, the draft counts), where the engine reports them.
    spec: dict[str, Any] | None = None
    # A vLLM server's spec_decode counters' growth since the worker's first reading
    # (fleetgen/engine/speculation.py CounterDeltas): vLLM reports acceptance only there.
    spec_counters: dict[str, Any] | None = None

# What a result says about its answer, counted by the worker (stats) and the drainer (summary):
# both read it from the record alone, so the drainer rebuilds it from its files.
QUALITY_COUNTS = ("empty", "reasoning_unfinished", "json_invalid")


def stream_entry(kind: str, record: dict[str, Any]) -> dict[Any, Any]:
    """The fields to XADD for one outcome."""
    return {FIELD_KIND: kind, FIELD_DATA: orjson.dumps(record)}


def read_entry(fields: dict[bytes, bytes]) -> tuple[str, bytes] | None:
    """(kind, record bytes) of a stream entry, or None for one deleted since it was read
    (a pending re-read of an XDELed entry comes back empty)."""
    if not fields or _DATA_B not in fields:
        return None
    return fields[_KIND_B].decode(), fields[_DATA_B]


def result_record(payload: TaskPayload, gen: Generation, *, max_tokens: int, attempts: int,
                  worker: str) -> dict[str, Any]:
    """The result line of one answer: the input row's fields (those named like one of
    RESULT_FIELDS kept whole under SHADOWED), then fleetgen's."""
    record = carry_row(payload["row"])
    record.update(
        id=payload["id"],
        completion=gen.text,
        finish_reason=gen.finish_reason,
        prompt_tokens=gen.prompt_tokens,
        completion_tokens=gen.completion_tokens,
        cached_tokens=gen.cached_tokens,
        max_tokens=max_tokens,
        latency_s=round(gen.latency_s, 4),
        attempts=attempts,
        worker=worker,
        line=payload["line"],
        # Unix seconds when the answer came back: what `fleetgen report` draws the run's
        # throughput over time from, with the files alone (no Redis needed).
        finished_at=round(time.time(), 3),
    )
    if payload.get("think"):
        # `completion` is the answer alone; the reasoning beside it.
        split = split_reasoning(gen.text, gen.output_ids,
                                think_open=bool(payload.get("think_open")),
                                stopped=gen.stop_matched is not None)
        record.update(completion=split.completion, reasoning=split.reasoning,
                      reasoning_tokens=split.reasoning_tokens,
                      reasoning_unfinished=split.unfinished)
    schema = payload.get("json_schema")
    if schema is not None:
        error = json_error(record["completion"], schema)
        record["json_valid"] = error is None
        if error is not None:
            record["json_error"] = error
    if gen.logprobs is not None:
        record["logprobs"] = gen.logprobs
    if gen.spec is not None:
        record["spec"] = gen.spec
    if gen.spec_counters is not None:
        record["spec_counters"] = gen.spec_counters
    if payload.get("token_ids") and gen.output_ids is not None:
        # A plain JSON list: what every trainer's loader reads as it is (`input_ids` in
        # speculators' and SpecForge's rows); about 7 bytes a token (docs/formats.md "Token ids").
        record["output_ids"] = gen.output_ids
        # The prompt's ids are rendered again at export, not stored: their digest (39 bytes a
        # line) lets the export prove it rebuilt exactly the ids that were sent.
        record["prompt_ids_digest"] = ids_digest(payload["input_ids"])
    return _request_of(payload, record)


def reused_record(payload: TaskPayload, earlier: Mapping[str, Any], source: str
                  ) -> dict[str, Any]:
    """The result line of a request answered before this run (`fleetgen estimate`'s sample,
    producer/reuse.py): the earlier answer and how it was made, under this request's own
    identity (its line, slot, sample, file) and budget, and `reused`: where it came from. The
    row's fields are this run's (the same as the earlier's: producer/reuse.py checks)."""
    record = carry_row(payload["row"])
    answer = split_result(earlier).fleetgen
    for name in _REQUEST_FIELDS:  # the earlier run's numbering, not this one's
        answer.pop(name, None)
    record.update(answer)
    # max_tokens is this request's: the answer is what it would have been given (an answer
    # that ran into the earlier budget is reused only where that budget is this one).
    record.update(id=payload["id"], line=payload["line"], max_tokens=payload["max_tokens"],
                  reused=source)
    return _request_of(payload, record)


def ids_digest(ids: list[int]) -> str:
    """A short, stable fingerprint of a token id sequence: blake2b-64 of the ids as
    little-endian uint32, in hex."""
    values = array("I", ids)
    if sys.byteorder != "little":
        values.byteswap()  # the same digest whatever machine wrote or reads it
    return hashlib.blake2b(values.tobytes(), digest_size=8).hexdigest()


def quality_counts(record: dict[str, Any]) -> dict[str, int]:
    """`QUALITY_COUNTS` of one result record: an answer with no non-whitespace completion, one
    that ran out of budget (or stopped) inside its reasoning, one not valid for its schema."""
    return {
        "empty": int(not str(record.get("completion") or "").strip()),
        "reasoning_unfinished": int(record.get("reasoning_unfinished") is True),
        "json_invalid": int(record.get("json_valid") is False),
    }


def result_counts(record: dict[str, Any]) -> dict[str, int]:
    """The run's counters one result moves (`done`, `truncated`, its tokens and its
    `quality_counts`), only those that move: each is a Redis command per result. The worker's
    answers and the estimate's reused ones (producer/enqueue.py) count alike."""
    counts = {
        "done": 1,
        "truncated": int(record.get("finish_reason") == "length"),
        "prompt_tokens": int(record.get("prompt_tokens") or 0),
        "completion_tokens": int(record.get("completion_tokens") or 0),
        **quality_counts(record),
    }
    return {name: n for name, n in counts.items() if n}


def failure_record(payload: TaskPayload, error: EngineError, *, max_tokens: int, attempts: int,
                   worker: str) -> dict[str, Any]:
    return _request_of(payload, {
        "id": payload["id"],
        "error": {"type": error.kind, "message": error.message, "status": error.status},
        "attempts": attempts,
        "max_tokens": max_tokens,
        "prompt_tokens": len(payload["input_ids"]),
        "worker": worker,
        "line": payload["line"],
        "finished_at": round(time.time(), 3),
    })


def request_fields(*, line: int, slot: int, sample: int | None, turn: int | None,
                   turns: int | None) -> dict[str, Any]:
    """REQUEST_FIELDS of one request of the row at `line`: `sample` when the row is asked for
    several times, `slot` where it is not the line (the drainer and the bitmaps key on it),
    `turn` of `turns` with `--turns all`."""
    fields: dict[str, Any] = {}
    if sample is not None:
        fields["sample"] = sample
    if slot != line:
        fields["slot"] = slot
    if turn is not None and turns is not None:
        fields["turn"], fields["turns"] = turn, turns
    return fields


def _request_of(payload: TaskPayload, record: dict[str, Any]) -> dict[str, Any]:
    for name in _REQUEST_FIELDS:
        if name in payload:
            record[name] = payload[name]  # type: ignore[literal-required]
    return record


def rejected_record(row_id: str, line: int, reason: str, prompt_tokens: int | None = None, *,
                    file: str | None = None, position: int | None = None) -> dict[str, Any]:
    """`line` is the row's number in the run; with several input files, `file` and
    `position` (its line, or Parquet row, in that file) say where to find it."""
    record: dict[str, Any] = {"id": row_id, "reason": reason, "line": line}
    if file is not None:
        record["file"] = file
        record["position"] = position
    if prompt_tokens is not None:
        record["prompt_tokens"] = prompt_tokens
    return record


def duplicate_record(row_id: str, line: int, *, file: str | None = None,
                     position: int | None = None) -> dict[str, Any]:
    """A later row reusing an id is rejected under `<id>#<line>`, so no id is ever written
    twice; `duplicate_of` names the id it repeats."""
    record = rejected_record(f"{row_id}#{line}", line,
                             "duplicate_id: an earlier row has the same id", file=file,
                             position=position)
    record["duplicate_of"] = row_id
    return record


def holdout_record(row_id: str, fields: dict[str, Any], line: int, first_slot: int,
                   slots: int) -> dict[str, Any]:
    """The holdout.jsonl line of a held-out row: the input row as it was (so `fleetgen run
    holdout.jsonl` takes it; a field named like one of fleetgen's under SHADOWED, as in a
    result), its `id` and `line`, and, where the row has several requests (--n, --turns all),
    the first one's `slot` and how many `slots` the line stands for."""
    record: dict[str, Any] = {"id": row_id, **carry_row(fields), "line": line}
    if first_slot != line:
        record["slot"] = first_slot
    if slots > 1:
        record["slots"] = slots
    return record

