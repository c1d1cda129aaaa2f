"""Read prompt rows as a stream (JSONL or Parquet) and turn each into a Row or a BadRow."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fleetgen.base.errors import InputError

# A line longer than this is rejected unread-as-JSON: it would cost more memory than the
# prompt could ever fit in a context anyway. 64 MiB leaves room for huge multi-turn rows.
MAX_LINE_BYTES = 64 * 1024 * 1024

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "chatgpt": "assistant", "bing": "assistant"}
ROLES = {"system", "user", "assistant", "tool", "developer"}


@dataclass(frozen=True)
class Row:
    """One usable input row. Exactly one of `messages` and `prompt` is set."""

    line: int
    id: str
    messages: list[dict[str, Any]] | None
    prompt: str | None
    fields: dict[str, Any] = field(default_factory=dict)  # the row minus `id`, carried through
    # Per-row options (a `sampling` object, or an OpenAI Batch body); the run's flags are the
    # defaults. `max_tokens` caps the budget, never raises it.
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    n: int | None = None  # samples of this row; None: the run's --n
    json_schema: str | None = None  # a JSON Schema document as a JSON string
    source: str | None = None  # the input file, when the input is several files
    position: int | None = None  # the row's line (or Parquet row) in `source`


@dataclass(frozen=True)
class BadRow:
    """A row that cannot be used, with the reason. Its id is the row's own where it could be
    read, else derived from its bytes, so every output line has an id."""

    line: int
    reason: str
    id: str


def read_rows(path: Path) -> Iterator[Row | BadRow]:
    """Yield one Row or BadRow per input line (JSONL) or row (Parquet), in order."""
    if not path.exists():
        raise InputError(f"input file not found: {path}")
    if path.is_dir():
        raise InputError(f"input is a directory, not a file: {path}")
    if path.suffix in (".parquet", ".pq"):
        yield from _read_parquet(path)
    else:
        yield from _read_jsonl(path)


def count_rows(path: Path) -> int:
    """How many rows read_rows will yield, cheaply (newlines, or Parquet's metadata), so
    progress bars and ETAs have a total from the first second."""
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    count, last = 0, b"\n"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def _read_jsonl(path: Path) -> Iterator[Row | BadRow]:
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if len(raw) > MAX_LINE_BYTES:
                yield BadRow(line_no, f"line_too_long: {len(raw)} bytes (limit "
                             f"{MAX_LINE_BYTES})", derive_id(raw))
                continue
            if not raw.strip():
                yield BadRow(line_no, "empty_line", f"line-{line_no}")
                continue
            yield parse_line(line_no, raw)


def parse_line(line_no: int, raw: bytes) -> Row | BadRow:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        cause = "invalid_utf8" if _bad_utf8(raw) else "invalid_json"
        return BadRow(line_no, f"{cause}: {exc}", derive_id(raw))
    return parse_row(line_no, obj)


def derive_id(data: bytes) -> str:
    """An id from the row's bytes, so re-reading the same file gives the same ids."""
    return "row-" + hashlib.blake2b(data, digest_size=10).hexdigest()


def _bad_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _read_parquet(path: Path) -> Iterator[Row | BadRow]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise InputError(f"cannot read Parquet file {path}: {exc}") from exc
    names = set(pf.schema_arrow.names)
    if not names & {"messages", "conversations", "prompt"}:
        raise InputError(
            f"Parquet file {path} has none of the columns messages, conversations, prompt "
            f"(it has: {', '.join(sorted(names)) or 'none'})"
        )
    line_no = 0
    for batch in pf.iter_batches(batch_size=1024):
        for obj in batch.to_pylist():
            line_no += 1
            yield parse_row(line_no, {k: v for k, v in obj.items() if v is not None})


def parse_row(line_no: int, obj: Any) -> Row | BadRow:
    """Validate one decoded row; never raises for bad data."""
    if not isinstance(obj, dict):
        return BadRow(line_no, f"not_an_object: a row must be a JSON object, got {_kind(obj)}",
                      derive_id(orjson.dumps(obj)))
    row_id, id_error = _row_id(obj)
    if id_error:
        return BadRow(line_no, id_error, derive_id(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)))
    fields = {k: v for k, v in obj.items() if k != "id"}
    try:
        messages, prompt = _conversation(obj)
    except ValueError as exc:
        return BadRow(line_no, str(exc), row_id)
    return Row(line_no, row_id, messages, prompt, fields)


def _row_id(obj: dict[str, Any]) -> tuple[str, str | None]:
    raw = obj.get("id")
    if raw is None:
        return derive_id(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)), None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        return "", f"bad_id: id must be a string, got {_kind(raw)}"
    text = str(raw)
    if not text.strip():
        return "", "bad_id: id is empty"
    return text, None


def _conversation(obj: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str | None]:
    if "messages" in obj:
        return _messages(obj["messages"], "messages"), None
    if "conversations" in obj:
        return _messages(obj["conversations"], "conversations"), None
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise ValueError(f"bad_prompt: prompt must be a string, got {_kind(prompt)}")
        if not prompt.strip():
            raise ValueError("empty_prompt: prompt is empty")
        return None, prompt
    raise ValueError("no_prompt: the row has none of messages, conversations, prompt")


def _messages(turns: Any, name: str) -> list[dict[str, Any]]:
    if not isinstance(turns, list):
        raise ValueError(f"bad_{name}: {name} must be a list of turns, got {_kind(turns)}")
    messages = [_turn(t, i, name) for i, t in enumerate(turns)]
    # A trailing assistant turn is the answer we are about to regenerate.
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages:
        raise ValueError(f"empty_{name}: no turn left to answer")
    return messages


def _turn(turn: Any, index: int, name: str) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise ValueError(f"bad_{name}: turn {index} must be an object, got {_kind(turn)}")
    if "from" in turn or "value" in turn:
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        content = turn.get("value")
    else:
        role = turn.get("role") if turn.get("role") in ROLES else None
        content = turn.get("content")
    if role is None:
        got = turn.get("from", turn.get("role"))
        raise ValueError(f"bad_{name}: turn {index} has unknown role {got!r}")
    if not isinstance(content, str | list):
        raise ValueError(f"bad_{name}: turn {index} content must be text, got {_kind(content)}")
    return {"role": role, "content": content}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
