"""`--format openai-batch`: one line per input line, in input order, shaped as the output file
of OpenAI's Batch API and vLLM's batch runner, so tools written for those read a fleetgen run.

A line is `{id, custom_id, response: {status_code, request_id, body}, error}`. The body follows
the input's URL: a `chat.completion` (choices with a `message`) for `/v1/chat/completions`
and for conversation rows, a `text_completion` (choices with `text`) for `/v1/completions` and
for `prompt` rows; the samples of a row are its `choices`, indexed by sample, and `usage` counts
the prompt once and every sample's completion. Ids are derived from the run, the line and the
custom_id, so exporting again gives the same file.

An input line that did not get all its answers is an error line, as an `n` request that fails
fails whole at OpenAI and vLLM: a line with fewer choices than asked for would pass for a
success with every reader that checks `error` and never counts choices. The samples that did
succeed are in results.jsonl and in the other formats, and `fleetgen retry` can finish the row.
A rejected row (never sent) answers 400 as the server would have; a failure keeps the engine's
HTTP status, and one that never got an HTTP answer (timeouts, a server gone) has
`response: null`, as OpenAI writes requests that never ran. `error` is `{code, message}`: the
rejection's reason code, or the failure's error type. Error lines are in the one file, as vLLM's
runner writes them (OpenAI puts them in an error file of their own).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from fleetgen.exporter import shape
from fleetgen.exporter.source import KINDS, DrainedLine, DrainedRun
from fleetgen.queue.contract import KIND_REJECTED, KIND_RESULT

DEFAULT_MODEL = "fleetgen"
REJECTED_STATUS = 400  # what the engine answers a request it cannot take


@dataclass(frozen=True)
class Context:
    run: str
    created: int
    model: str | None  # --model, else the run's summary; None: each row's own, else DEFAULT
    reasoning: str


def batch_line(group: list[DrainedLine], ctx: Context) -> dict[str, Any]:
    """The output line of one input line, from its outcomes (one per sample, in order).

    Follows vLLM 0.33 `run_request` (vllm/entrypoints/launchers/run_batch.py): an answer is
    `BatchRequestOutput(id, custom_id, response=BatchResponseData(body=..., request_id=...),
    error=None)` with status 200; an error response keeps its status code with no body and
    the error beside it; `make_error_request_output` answers a request it cannot run with 400.
    """
    first = group[0].record
    custom_id = _custom_id(group)
    digest = hashlib.blake2b(f"{ctx.run}\0{first['line']}\0{custom_id}".encode(),
                             digest_size=12).hexdigest()
    line: dict[str, Any] = {"id": f"batch_req_{digest}", "custom_id": custom_id}
    errors = [o for o in group if o.kind != KIND_RESULT]
    if errors:
        status, error = _error(errors, len(group) - len(errors))
        line["response"] = None if status is None else {
            "status_code": status, "request_id": f"req_{digest}", "body": None}
        line["error"] = error
        return line
    line["response"] = {"status_code": 200, "request_id": f"req_{digest}",
                        "body": _body([o.record for o in group], digest, ctx)}
    line["error"] = None
    return line


def _custom_id(group: list[DrainedLine]) -> str:
    """The input line's custom_id: a Batch row's own; for other rows the id, which is what a
    Batch row's id is too. A duplicate row's rejection names the id it repeats."""
    for outcome in group:
        record = outcome.record
        if isinstance(record.get("custom_id"), str):
            return str(record["custom_id"])
        if isinstance(record.get("duplicate_of"), str):
            return str(record["duplicate_of"])
    return str(group[0].record["id"])


def _error(errors: list[DrainedLine], answered: int) -> tuple[int | None, dict[str, Any]]:
    """The line's status and error, from its first unanswered sample; when other samples were
    answered, the message says how many were not."""
    kind, record, _ = errors[0]
    if kind == KIND_REJECTED:
        reason = str(record.get("reason", ""))
        status: int | None = REJECTED_STATUS
        code, message = reason.partition(":")[0].strip() or "rejected", reason
    else:
        info = record.get("error") or {}
        raw_status = info.get("status")
        status = raw_status if isinstance(raw_status, int) else None
        code, message = str(info.get("type") or "failed"), str(info.get("message") or "")
    if answered:
        which = record.get("sample")
        message = (f"{len(errors)} of {len(errors) + answered} samples got no answer; sample "
                   f"{which}: {message}")
    return status, {"code": code, "message": message}


def _body(results: list[dict[str, Any]], digest: str, ctx: Context) -> dict[str, Any]:
    first = results[0]
    chat = shape.endpoint(first) == shape.CHAT_URL
    completion_tokens = sum(int(r.get("completion_tokens") or 0) for r in results)
    prompt_tokens = int(first.get("prompt_tokens") or 0)
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens,
                             "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}
    reasoning_counts = [r["reasoning_tokens"] for r in results
                        if isinstance(r.get("reasoning_tokens"), int)]
    if reasoning_counts:
        usage["completion_tokens_details"] = {"reasoning_tokens": sum(reasoning_counts)}
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{digest}",
        "object": "chat.completion" if chat else "text_completion",
        "created": ctx.created,
        "model": _model(first, ctx),
        "choices": [(_chat_choice if chat else _text_choice)(r, i, ctx.reasoning)
                    for i, r in enumerate(results)],
        "usage": usage,
    }


def _model(record: dict[str, Any], ctx: Context) -> str:
    if ctx.model:
        return ctx.model
    asked = record["body"].get("model") if shape.is_batch_row(record) else None
    return str(asked) if asked else DEFAULT_MODEL


def _index(record: dict[str, Any], position: int) -> int:
    sample = record.get("sample")
    return int(sample) if isinstance(sample, int) else position


def _chat_choice(record: dict[str, Any], position: int, reasoning: str) -> dict[str, Any]:
    content, thought = shape.answer(record, reasoning)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thought is not None:
        message["reasoning"] = thought  # vLLM's ChatMessage field for it
    return {"index": _index(record, position), "message": message,
            "logprobs": _chat_logprobs(record.get("logprobs")),
            "finish_reason": record.get("finish_reason")}


def _text_choice(record: dict[str, Any], position: int, reasoning: str) -> dict[str, Any]:
    # A completions choice has no reasoning field: kept, it stays in the text, where a
    # /v1/completions server leaves it.
    text, _ = shape.answer(record, "inline" if reasoning == "keep" else reasoning)
    return {"index": _index(record, position), "text": text,
            "logprobs": _text_logprobs(record.get("logprobs")),
            "finish_reason": record.get("finish_reason")}


def _token(token_id: Any) -> str:
    # No token text is stored (fleetgen/records/logprobs.py): tokens are named by id, as vLLM
    # names them with --return-tokens-as-token-ids.
    return f"token_id:{token_id}"


def _chat_logprobs(compact: Any) -> dict[str, Any] | None:
    if not isinstance(compact, dict):
        return None
    top_ids, top_lp = compact.get("top_ids") or [], compact.get("top_lp") or []
    content = []
    for i, (token_id, logprob) in enumerate(zip(compact.get("ids") or [],
                                                compact.get("lp") or [], strict=False)):
        top = zip(top_ids[i], top_lp[i], strict=False) if i < len(top_ids) else ()
        content.append({"token": _token(token_id), "logprob": logprob, "bytes": None,
                        "top_logprobs": [{"token": _token(t), "logprob": lp, "bytes": None}
                                         for t, lp in top]})
    return {"content": content}


def _text_logprobs(compact: Any) -> dict[str, Any] | None:
    if not isinstance(compact, dict):
        return None
    top_ids, top_lp = compact.get("top_ids"), compact.get("top_lp") or []
    ids = compact.get("ids") or []
    return {
        "tokens": [_token(t) for t in ids],
        "token_logprobs": list(compact.get("lp") or []),
        "top_logprobs": ([{_token(t): lp for t, lp in zip(row, lps, strict=False)}
                          for row, lps in zip(top_ids, top_lp, strict=False)]
                         if top_ids is not None else None),
        "text_offset": [],  # offsets need the token texts, which are not stored
    }


def write(source: DrainedRun, out: BinaryIO, ctx: Context) -> tuple[int, int]:
    """One line per input line that has an outcome, in input order; returns (lines written,
    outcomes superseded)."""
    index = source.index(KINDS)
    written = 0
    for group in index.groups():
        out.write(orjson.dumps(batch_line(group, ctx)) + b"\n")
        written += 1
    return written, index.superseded

