"""A drained output directory written by hand, record by record as the drainer writes them:
every kind of input row and outcome, the three files interleaved in a scrambled drain order.

Input lines (1-based) and what became of them:
 1 `messages` with a system turn and a trailing answer (dropped), extra fields -> result
 2 ShareGPT `conversations` (from/value), a thinking answer -> result with reasoning
 3 `conversations` with role/content -> result cut at its budget (length)
 4 `prompt` -> result
 5 too long, asked for twice -> rejected, once per sample
 6 invalid JSON -> rejected under an id derived from its bytes
 7 refused by the engine (HTTP 400) -> failure
 8 timed out on every attempt (no HTTP answer) -> failure
 9 `messages`, three samples, each with reasoning and logprobs -> three results
10 `messages`, two samples: one answered, one failed (503) -> result + failure
11 an OpenAI Batch line for /v1/chat/completions -> result
12 an OpenAI Batch line for /v1/completions, with logprobs -> result
13 a row repeating line 1's id -> rejected as a duplicate
14 failed, retried and answered; the drainer was killed before it dropped the failure ->
   failure and result both on disk
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from fleetgen.records.outcomes import carry_row

RUN = "exp-fixture"
FINISHED_AT = 1_790_000_000.75
SYSTEM = {"role": "system", "content": "You are terse."}
LOGPROBS_9 = [
    {"ids": [11, 12], "lp": [-0.1, -0.25], "top_ids": [[11, 7], [12, 9]],
     "top_lp": [[-0.1, -2.5], [-0.25, -1.75]]},
    {"ids": [13], "lp": [-0.5], "top_ids": [[13, 4]], "top_lp": [[-0.5, -1.0]]},
    {"ids": [14, 15, 16], "lp": [-0.01, -0.02, -0.03], "top_ids": [[14], [15], [16]],
     "top_lp": [[-0.01], [-0.02], [-0.03]]},
]
LOGPROBS_12 = {"ids": [101, 102], "lp": [-0.125, -0.5]}


def result(row: dict[str, Any], row_id: str, line: int, completion: str, *,
           finish: str = "stop", prompt_tokens: int = 20, completion_tokens: int = 5,
           **extra: Any) -> dict[str, Any]:
    """A result line as fleetgen writes it: the row's fields, then fleetgen's."""
    record = carry_row(row)
    record.update(id=row_id, completion=completion, finish_reason=finish,
                  prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                  cached_tokens=0, max_tokens=1000, latency_s=0.25, attempts=1,
                  worker="gpu0@host", line=line)
    record.update(extra)
    return record


def failure(row_id: str, line: int, kind: str, message: str, status: int | None,
            **extra: Any) -> dict[str, Any]:
    return {"id": row_id, "error": {"type": kind, "message": message, "status": status},
            "attempts": 5, "max_tokens": 1000, "prompt_tokens": 20, "worker": "gpu1@host",
            "line": line, **extra}


def rejected(row_id: str, line: int, reason: str, **extra: Any) -> dict[str, Any]:
    return {"id": row_id, "reason": reason, "line": line, **extra}


MESSAGES_1 = [SYSTEM, {"role": "user", "content": "Name a prime."},
              {"role": "assistant", "content": "an old answer"}]
SHAREGPT_2 = [{"from": "human", "value": "What is 2+2?"},
              {"from": "gpt", "value": "5"},
              {"from": "human", "value": "Check again, 数据 😀."}]
ROLES_3 = [{"role": "user", "content": "Write a long poem."}]
MESSAGES_9 = [{"role": "user", "content": "Pick a colour."}]
MESSAGES_10 = [{"role": "user", "content": "Pick a number."}]
BATCH_11 = {"custom_id": "req-11", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "qwen3-batch", "messages": [{"role": "user", "content": "Hi!"}],
                     "max_tokens": 50, "stop": "\n\n"}}
BATCH_12 = {"custom_id": "req-12", "method": "POST", "url": "/v1/completions",
            "body": {"model": "qwen3-batch", "prompt": "Once upon a time", "max_tokens": 8}}


def records() -> dict[str, list[dict[str, Any]]]:
    """The fixture's records by file, in input order."""
    results = [
        result({"messages": MESSAGES_1, "source": "mix-v2", "tags": ["math", "short"]},
               "a", 1, "7."),
        result({"conversations": SHAREGPT_2, "source": "sharegpt"}, "b", 2, "It is 4.",
               reasoning="2+2 is 4, not 5.", reasoning_tokens=9, reasoning_unfinished=False,
               completion_tokens=15),
        result({"conversations": ROLES_3}, "c", 3, "Roses are", finish="length",
               completion_tokens=1000),
        result({"prompt": "The capital of France is"}, "d", 4, " Paris."),
        *[result({"messages": MESSAGES_9}, "i", 9, f"colour {s}", sample=s, slot=10 + s,
                 reasoning=f"thinking {s}", reasoning_tokens=3 + s,
                 reasoning_unfinished=False, logprobs=LOGPROBS_9[s],
                 completion_tokens=len(LOGPROBS_9[s]["ids"]))
          for s in range(3)],
        result({"messages": MESSAGES_10}, "j", 10, "42", sample=0, slot=13),
        result(BATCH_11, "req-11", 11, "Hello!", prompt_tokens=9, completion_tokens=2),
        result(BATCH_12, "req-12", 12, " there was", prompt_tokens=4, completion_tokens=2,
               logprobs=LOGPROBS_12),
        result({"messages": [{"role": "user", "content": "Retry me."}]}, "n", 14, "Done."),
    ]
    failures = [
        failure("g", 7, "permanent", "400: the prompt has an image part", 400),
        failure("h", 8, "retryable", "engine timed out after 900 s", None),
        failure("j", 10, "retryable", "503: server overloaded", 503, sample=1, slot=14),
        failure("n", 14, "retryable", "502: bad gateway", 502),
    ]
    rejections = [
        *[rejected("e", 5, "prompt_too_long: 9000 prompt tokens >= 8187", prompt_tokens=9000,
                   sample=s, slot=5 + s) for s in range(2)],
        rejected("row-0123456789abcdef0123", 6,
                 "invalid_json: unexpected character: line 1 column 13 (char 12)"),
        rejected("a#13", 13, "duplicate_id: an earlier row has the same id",
                 duplicate_of="a"),
    ]
    return {"results.jsonl": results, "failures.jsonl": failures, "rejected.jsonl": rejections}


def write_output_dir(out: Path, *, complete: bool = True, seed: int = 3) -> Path:
    """The fixture as the drainer leaves it: marker, three files in a scrambled drain order
    (each file's lines in the order they were drained), summary.json."""
    out.mkdir(parents=True)
    (out / ".fleetgen-run").write_text(RUN + "\n")
    by_file = records()
    drained = [(name, r) for name, rows in by_file.items() for r in rows]
    random.Random(seed).shuffle(drained)
    for name in by_file:
        lines = [orjson.dumps(r) + b"\n" for n, r in drained if n == name]
        (out / name).write_bytes(b"".join(lines))
    summary = {"run": RUN, "total": 14, "done": 11, "failed": 3, "rejected": 4,
               "truncated": 1, "complete": complete, "started_at": FINISHED_AT - 60,
               "finished_at": FINISHED_AT}
    (out / "summary.json").write_bytes(orjson.dumps(summary))
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), f"{path} does not end with a whole line"
    return [orjson.loads(line) for line in raw.splitlines()]


def without_nulls(value: Any) -> Any:
    """A value as JSON would have it: Parquet fills keys a row lacks with nulls."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value
