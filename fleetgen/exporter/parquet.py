"""`--format parquet`: the results table, one row per result in input order, written a row group
at a time (memory holds one group, whatever the run's size). `write_rows` writes any row shape
so: `--format conversations --out FILE.parquet` is the conversations export as a table.

Parquet needs the schema before the first row group, so the scan that indexes the results also
infers it, over every record: fleetgen's own columns have fixed types (`logprobs` a struct of
lists), the input row's columns (`messages` as list<struct<role, content>>, any field of the
user's) take the type pyarrow infers, widened across all rows (an int column with one float is
double, structs gather every key seen). A column whose values no one type holds (a number in
one row, text in another) is written as JSON text, and so is a Batch line's `body` (request
bodies differ in shape from row to row); the file's metadata lists these columns under
`fleetgen.json_columns`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from fleetgen.exporter import shape
from fleetgen.exporter.finished import Selection
from fleetgen.exporter.source import DrainedRun
from fleetgen.queue.contract import KIND_RESULT

log = logging.getLogger("fleetgen.exporter")

LOGPROBS = pa.struct([("ids", pa.list_(pa.int64())), ("lp", pa.list_(pa.float64())),
                      ("top_ids", pa.list_(pa.list_(pa.int64()))),
                      ("top_lp", pa.list_(pa.list_(pa.float64())))])
# Fleetgen's own columns: the same types in every export, whatever the data.
DECLARED: dict[str, pa.DataType] = {
    "id": pa.string(), "completion": pa.string(), "finish_reason": pa.string(),
    "prompt_tokens": pa.int64(), "completion_tokens": pa.int64(),
    "cached_tokens": pa.int64(), "max_tokens": pa.int64(), "latency_s": pa.float64(),
    "attempts": pa.int64(), "worker": pa.string(), "line": pa.int64(), "sample": pa.int64(),
    "slot": pa.int64(), "reasoning": pa.string(), "reasoning_tokens": pa.int64(),
    "reasoning_unfinished": pa.bool_(), "json_valid": pa.bool_(), "json_error": pa.string(),
    "file": pa.string(), "position": pa.int64(), "logprobs": LOGPROBS,
    "output_ids": pa.list_(pa.int64()), "prompt_ids_digest": pa.string(),
    "finished_at": pa.float64(),
}
ALWAYS = ("id", "completion", "finish_reason", "prompt_tokens", "completion_tokens",
          "cached_tokens", "max_tokens", "latency_s", "attempts", "worker", "line")
JSON_ALWAYS = frozenset({"body"})
CHUNK_ROWS = 2048  # rows per type inference
GROUP_ROWS = 100_000  # rows per row group at most
GROUP_BYTES = 16 << 20  # and about this much JSON per row group (memory: a few times it)


def table_row(record: dict[str, Any], reasoning: str) -> dict[str, Any]:
    """A result record as a table row under a --reasoning mode."""
    row = dict(record)
    content, thought = shape.answer(record, reasoning)
    row["completion"] = content
    if thought is None:
        row.pop("reasoning", None)
    return row


class SchemaBuilder:
    """The table's schema, widened chunk by chunk over every row."""

    def __init__(self, always: Sequence[str] = ALWAYS) -> None:
        self.types: dict[str, pa.DataType] = {name: DECLARED[name] for name in always}
        self.json: set[str] = set()
        self._chunk: list[dict[str, Any]] = []
        self._bytes = 0

    def add(self, row: dict[str, Any], size: int) -> None:
        self._chunk.append(row)
        self._bytes += size
        if len(self._chunk) >= CHUNK_ROWS or self._bytes >= GROUP_BYTES:
            self._infer()

    def schema(self, run: str) -> pa.Schema:
        self._infer()
        fields = [pa.field(name, pa.string() if name in self.json else kind)
                  for name, kind in self.types.items()]
        return pa.schema(fields, metadata={"fleetgen.run": run,
                                           "fleetgen.json_columns": ",".join(sorted(self.json))})

    def _infer(self) -> None:
        names = dict.fromkeys(name for row in self._chunk for name in row)
        for name in names:
            if name in DECLARED:
                self.types.setdefault(name, DECLARED[name])
            elif name in JSON_ALWAYS or name in self.json:
                self.json.add(name)
                self.types.setdefault(name, pa.string())
            else:
                self._widen(name, [row.get(name) for row in self._chunk])
        self._chunk.clear()
        self._bytes = 0

    def _widen(self, name: str, values: list[Any]) -> None:
        try:
            kind = pa.array(values).type
            if name in self.types:
                kind = pa.unify_schemas(
                    [pa.schema([(name, self.types[name])]), pa.schema([(name, kind)])],
                    promote_options="permissive").field(name).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                OverflowError) as exc:
            log.warning("parquet: column %r holds values of different types (%s); written as "
                        "JSON text", name, str(exc).splitlines()[0])
            self.json.add(name)
            kind = pa.string()
        self.types[name] = kind


def write(source: DrainedRun, out: BinaryIO, reasoning: str,
          selection: Selection | None = None) -> tuple[int, int]:
    """Every result (every finished one, by `selection`) as a table row, in input order;
    returns (rows written, outcomes superseded)."""
    return write_rows(source, out, lambda record: table_row(record, reasoning),
                      selection or Selection())


def write_rows(source: DrainedRun, out: BinaryIO,
               to_row: Callable[[dict[str, Any]], dict[str, Any]], selection: Selection,
               always: Sequence[str] = ALWAYS) -> tuple[int, int]:
    """Each result `selection` admits, as `to_row` shapes it, in input order; `always`: the
    columns every table has, first. The schema comes from the same rows (the index's scan)."""
    builder = SchemaBuilder(always)

    def observe(record: dict[str, Any], size: int) -> None:
        if selection.wanted(record):
            builder.add(to_row(record), size)

    index = source.index((KIND_RESULT,), observe=observe)
    json_columns = builder.json

    def batches() -> Iterator[list[dict[str, Any]]]:
        rows: list[dict[str, Any]] = []
        size = 0
        for group in index.groups():
            for outcome in group:
                if selection.admit(outcome.record):
                    rows.append(_encoded(to_row(outcome.record), json_columns))
                    size += outcome.size
            if len(rows) >= GROUP_ROWS or size >= GROUP_BYTES:
                yield rows
                rows, size = [], 0
        yield rows

    return write_row_groups(out, builder.schema(source.info.run), batches()), index.superseded


def write_row_groups(out: BinaryIO, schema: pa.Schema,
                     batches: Iterable[list[dict[str, Any]]]) -> int:
    """One Parquet file, each non-empty batch of rows a row group (no rows at all: one empty
    group, so that the file still has its schema); returns the rows written."""
    written = 0
    with pq.ParquetWriter(out, schema) as writer:
        for batch in batches:
            if batch:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                written += len(batch)
        if not written:
            writer.write_table(pa.Table.from_pylist([], schema=schema))
    return written


def _encoded(row: dict[str, Any], json_columns: set[str]) -> dict[str, Any]:
    for name in json_columns:
        if row.get(name) is not None:
            row[name] = orjson.dumps(row[name]).decode()
    return row
