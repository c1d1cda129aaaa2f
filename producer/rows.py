"""Read prompt rows as a stream (JSONL plain, gzip or zstd, or Parquet; one file, a directory
or a glob) and turn each into a Row or a BadRow; OpenAI Batch lines included."""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fleetgen.errors import InputError
from producer.conversation import conversation, kind
from producer.inputs import InputFile, Inputs, Meter, iter_lines, resolve_input
from producer.openai_batch import batch_id, batch_request, is_batch_line
from producer.rowsampling import OptionError, Options, json_schema, sampling_object

# A line longer than this is rejected unread-as-JSON: it would cost more memory than the
# prompt could ever fit in a context anyway. 64 MiB leaves room for huge multi-turn rows.
MAX_LINE_BYTES = 64 * 1024 * 1024
PARQUET_BATCH_ROWS = 1024
# A bad line is shown this far in its rejection: where it breaks, not the whole row.
EXCERPT_CHARS = 60
PROMPT_FIELDS = ("messages", "conversations", "prompt")


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
    # The row's own `chat_template_kwargs`, over the run's (e.g. enable_thinking false on
    # some rows of a mixed set); the budget counts the row as it is rendered with them.
    template_kwargs: dict[str, Any] | None = None
    source: str | None = None  # the input file, when the input is several files
    position: int | None = None  # the row's line (or Parquet row) in `source`


@dataclass(frozen=True)
class BadRow:
    """A row that cannot be used, with the reason. Its id is the row's own where it could be
    read, else derived from its bytes, so every output line has an id."""

    line: int
    reason: str
    id: str
    source: str | None = None  # as in Row
    position: int | None = None


def read_rows(spec: Path | str | Inputs) -> Iterator[Row | BadRow]:
    """One Row or BadRow per line (JSONL) or row (Parquet) of every file of INPUT, in order.
    `line` runs on across the files (a row's identity in the run); with several files,
    `source` and `position` say which file and where in it."""
    inputs = resolve_input(spec)
    offset = 0
    for file in inputs.files:
        source = file.name if inputs.several else None
        if file.format == "parquet":
            offset += yield from _read_parquet(file, offset, source)
            inputs.meter.add(file.path.stat().st_size)
        else:
            offset += yield from _read_jsonl(file, offset, source, inputs.meter)


def _read_jsonl(file: InputFile, offset: int, source: str | None,
                meter: Meter) -> Generator[Row | BadRow, None, int]:
    position = 0
    for position, raw in enumerate(iter_lines(file, meter), start=1):
        line_no = offset + position
        if len(raw) > MAX_LINE_BYTES:
            yield BadRow(line_no, f"line_too_long: {len(raw)} bytes (limit {MAX_LINE_BYTES})",
                         derive_id(raw), source, position)
        elif not raw.strip():
            yield BadRow(line_no, "empty_line", f"line-{line_no}", source, position)
        else:
            yield parse_line(line_no, raw, source=source, position=position)
    return position


def parse_line(line_no: int, raw: bytes, *, source: str | None = None,
               position: int | None = None) -> Row | BadRow:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        cause = "invalid_utf8" if _bad_utf8(raw) else "invalid_json"
        return BadRow(line_no, f"{cause}: {exc}; near: {excerpt(raw, exc.pos)}",
                      derive_id(raw), source, position)
    return parse_row(line_no, obj, source=source, position=position)


def excerpt(raw: bytes, pos: int, width: int = EXCERPT_CHARS) -> str:
    """Up to `width` characters of the line around character `pos` (where the JSON parser
    stopped), "…" where cut, control characters as "?": enough to find the line's fault
    without copying a whole long row into rejected.jsonl."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    start = max(min(pos - width // 2, len(text) - width), 0)
    shown = "".join(c if c.isprintable() else "?" for c in text[start:start + width])
    return ("…" if start else "") + shown + ("…" if start + width < len(text) else "")


def derive_id(data: bytes) -> str:
    """An id from the row's bytes, so re-reading the same file gives the same ids."""
    return "row-" + hashlib.blake2b(data, digest_size=10).hexdigest()


def _bad_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def check_readable(inputs: Inputs) -> None:
    """InputError now for what would fail the pass before its rows could be read: a Parquet
    file without a prompt column (its footer says, without reading its rows). A run refuses
    it before it starts, where counting the rows beforehand used to."""
    for file in inputs.files:
        if file.format == "parquet":
            _parquet_file(file)


def _parquet_file(file: InputFile) -> Any:
    import pyarrow.parquet as pq

    if file.held.parquet is not None:  # checked on the handle resolve_input opened: reused
        return file.held.parquet
    held = file.held.take()
    try:
        # pre_buffer (pyarrow's default) reads ahead across row groups: memory grows with the
        # file (tests/producer/test_inputs.py measures it); off, one row group at a time.
        pf = pq.ParquetFile(held or file.path, pre_buffer=False)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise InputError(f"cannot read Parquet file {file.path}: {exc}") from exc
    names = set(pf.schema_arrow.names)
    if not names & {*PROMPT_FIELDS, "body"}:
        raise InputError(
            f"Parquet file {file.path} has none of the columns messages, conversations, "
            f"prompt, body (it has: {', '.join(sorted(names)) or 'none'})"
        )
    if held is not None:
        file.held.keep(pf)
    return pf


def _read_parquet(file: InputFile, offset: int,
                  source: str | None) -> Generator[Row | BadRow, None, int]:
    """Row group by row group, in batches: memory is one row group's, whatever the file's
    size. A null column is an absent field."""
    pf, position = _parquet_file(file), 0
    for group in range(pf.num_row_groups):
        for obj in _parquet_group(file, pf, group, position):
            position += 1
            yield parse_row(offset + position, {k: v for k, v in obj.items() if v is not None},
                            source=source, position=position)
    return position


def _parquet_group(file: InputFile, pf: Any, group: int, before: int) -> Iterator[Any]:
    """One row group's rows as dicts; a page that cannot be decoded is an InputError naming
    the file and the row group (the rows after it cannot be found)."""
    import pyarrow as pa

    try:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[group],
                                     use_threads=False):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"cannot read Parquet file {file.path}: row group {group} (rows from "
                         f"{before + 1}) is damaged: {' '.join(str(exc).split())}") from exc


def parse_row(line_no: int, obj: Any, *, source: str | None = None,
              position: int | None = None) -> Row | BadRow:
    """Validate one decoded row, plain or an OpenAI Batch line; never raises for bad data."""
    if not isinstance(obj, dict):
        return BadRow(line_no, f"not_an_object: a row must be a JSON object, got {kind(obj)}",
                      derive_id(orjson.dumps(obj)), source, position)
    batch = is_batch_line(obj)
    row_id, id_error = batch_id(obj) if batch else _row_id(obj)
    if id_error:
        return BadRow(line_no, id_error,
                      derive_id(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)), source, position)
    try:
        messages, prompt, options = batch_request(obj) if batch else _plain_request(obj)
        schema = _row_schema(obj, options)
        template_kwargs = _template_kwargs(obj)
    except ValueError as exc:
        return BadRow(line_no, str(exc), row_id, source, position)
    fields = {k: v for k, v in obj.items() if k != "id"}
    return Row(line_no, row_id, messages, prompt, fields, sampling=options.sampling,
               max_tokens=options.max_tokens, n=options.n, json_schema=schema,
               template_kwargs=template_kwargs, source=source, position=position)


def _row_schema(obj: dict[str, Any], options: Options) -> str | None:
    """The row's `json_schema`, or its Batch body's `response_format`; both is ambiguous."""
    given = obj.get("json_schema")
    if given is not None and options.json_schema is not None:
        raise OptionError("bad_option: json_schema and body.response_format both ask for a "
                          "schema; give one")
    return json_schema(given) if given is not None else options.json_schema


def _template_kwargs(obj: dict[str, Any]) -> dict[str, Any] | None:
    given = obj.get("chat_template_kwargs")
    if given is None:
        return None
    if not isinstance(given, dict):
        raise OptionError("bad_option: chat_template_kwargs must be an object, got "
                          f"{kind(given)}")
    return given or None


def _plain_request(obj: dict[str, Any]
                   ) -> tuple[list[dict[str, Any]] | None, str | None, Options]:
    messages, prompt = conversation(obj)
    sampling = obj.get("sampling")
    return messages, prompt, sampling_object(sampling) if sampling is not None else Options()


def _row_id(obj: dict[str, Any]) -> tuple[str, str | None]:
    raw = obj.get("id")
    if raw is None:
        return derive_id(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)), None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        return "", f"bad_id: id must be a string, got {kind(raw)}"
    text = str(raw)
    if not text.strip():
        return "", "bad_id: id is empty"
    return text, None
