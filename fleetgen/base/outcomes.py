"""Outcome records (pure): what a result, failure or rejection holds, and the stream entry
that carries it from the producer or a worker to the drainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from fleetgen.base.contract import TaskPayload
from fleetgen.base.errors import EngineError

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
    # Top-K log-probabilities per output token, compact (see engine clients), when asked.
    logprobs: dict[str, Any] | None = None


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
    # The input row's fields first, so ours win on a name clash (documented in README).
    record: dict[str, Any] = dict(payload["row"])
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
    )
    return record


def failure_record(payload: TaskPayload, error: EngineError, *, max_tokens: int, attempts: int,
                   worker: str) -> dict[str, Any]:
    return {
        "id": payload["id"],
        "error": {"type": error.kind, "message": error.message, "status": error.status},
        "attempts": attempts,
        "max_tokens": max_tokens,
        "prompt_tokens": len(payload["input_ids"]),
        "worker": worker,
        "line": payload["line"],
    }


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
