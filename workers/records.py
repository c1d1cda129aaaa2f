"""Builders of the output records (pure): what a result, failure or rejection line holds."""

from __future__ import annotations

from typing import Any

from fleetgen.contract import TaskPayload
from workers.engine import Generation
from workers.errors import EngineError


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


def rejected_record(row_id: str, line: int, reason: str,
                    prompt_tokens: int | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"id": row_id, "reason": reason, "line": line}
    if prompt_tokens is not None:
        record["prompt_tokens"] = prompt_tokens
    return record
