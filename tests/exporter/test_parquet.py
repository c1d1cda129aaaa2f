"""`fleetgen export --format parquet`: the results table in input order, fleetgen's columns with
fixed types, the input's nested columns as nested types, in row groups of bounded size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetgen.exporter import parquet
from fleetgen.records.outcomes import RESULT_FIELDS
from tests.support.cli import Export
from tests.support.outdir import RUN, records, result, without_nulls

FIXED = {
    "id": pa.string(), "completion": pa.string(), "finish_reason": pa.string(),
    "prompt_tokens": pa.int64(), "completion_tokens": pa.int64(),
    "cached_tokens": pa.int64(), "max_tokens": pa.int64(), "latency_s": pa.float64(),
    "attempts": pa.int64(), "worker": pa.string(), "line": pa.int64(), "sample": pa.int64(),
    "reasoning": pa.string(), "reasoning_tokens": pa.int64(),
    "logprobs": pa.struct([("ids", pa.list_(pa.int64())), ("lp", pa.list_(pa.float64())),
                           ("top_ids", pa.list_(pa.list_(pa.int64()))),
                           ("top_lp", pa.list_(pa.list_(pa.float64())))]),
}
TURN = pa.struct([("role", pa.string()), ("content", pa.string())])


def input_order(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(results, key=lambda r: (r["line"], r.get("sample", -1)))


def test_the_results_table(export: Export, drained: Path) -> None:
    ran = export(drained, "--format", "parquet")
    assert ran.code == 0, ran.err
    out = drained / "export.parquet"
    assert ran.out.strip() == f"fleetgen export: 11 rows of run '{RUN}' -> {out}"
    table = pq.read_table(out)
    schema = table.schema
    assert schema.names[:11] == ["id", "completion", "finish_reason", "prompt_tokens",
                                 "completion_tokens", "cached_tokens", "max_tokens",
                                 "latency_s", "attempts", "worker", "line"]
    for name, kind in FIXED.items():
        assert schema.field(name).type == kind, name
    assert schema.field("messages").type == pa.list_(TURN)
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("body").type == pa.string()  # JSON text: bodies differ in shape
    assert schema.metadata[b"fleetgen.json_columns"] == b"body"
    assert schema.metadata[b"fleetgen.run"] == RUN.encode()
    # Every row, every value: the result record it came from, in input order.
    want = input_order(records()["results.jsonl"])
    got = table.to_pylist()
    assert len(got) == len(want) == 11
    for row, record in zip(got, want, strict=True):
        if row["body"] is not None:
            row["body"] = orjson.loads(row["body"])
        assert without_nulls(row) == record, record["id"]


@pytest.mark.parametrize("reasoning", ["strip", "inline"])
def test_reasoning_strip_and_inline(reasoning: str, export: Export, drained: Path) -> None:
    assert export(drained, "--format", "parquet", "--reasoning", reasoning).code == 0
    table = pq.read_table(drained / "export.parquet")
    assert "reasoning" not in table.schema.names
    assert table.schema.field("reasoning_tokens").type == pa.int64()
    rows = {(r["id"], r["sample"]): r for r in table.to_pylist()}
    b = rows[("b", None)]["completion"]
    assert b == ("It is 4." if reasoning == "strip" else
                 "<think>\n2+2 is 4, not 5.\n</think>\n\nIt is 4.")
    assert rows[("a", None)]["completion"] == "7."


def test_row_groups_are_bounded_and_mixed_types_become_json(
        export: Export, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory holds one row group: 2,500 rows at most 1,000 a group make three. A field that is
    a number in one row and text in another is written as JSON text, never dropped."""
    monkeypatch.setattr(parquet, "GROUP_ROWS", 1000)
    monkeypatch.setattr(parquet, "CHUNK_ROWS", 300)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".fleetgen-run").write_text("big\n")
    rows = [result({"messages": [{"role": "user", "content": f"q{i}"}],
                    "meta": i if i < 2000 else f"v{i}", "score": 1 if i < 600 else 0.5},
                   f"r{i}", i + 1, f"answer {i}") for i in range(2500)]
    (out / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n"
                                                 for r in reversed(rows)))
    (out / "summary.json").write_bytes(orjson.dumps({"complete": True, "finished_at": 1.0}))
    ran = export(out, "--format", "parquet")
    assert ran.code == 0, ran.err
    f = pq.ParquetFile(out / "export.parquet")
    assert f.metadata.num_row_groups == 3
    assert f.schema_arrow.field("meta").type == pa.string()
    assert f.schema_arrow.field("score").type == pa.float64()  # int widened to double
    assert f.schema_arrow.metadata[b"fleetgen.json_columns"] == b"meta"
    table = f.read()
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(2500)]
    assert table.column("meta").to_pylist() == [orjson.dumps(r["meta"]).decode() for r in rows]
    assert table.column("score").to_pylist()[598:602] == [1.0, 1.0, 0.5, 0.5]


def test_a_run_with_no_results_gives_an_empty_table_with_the_fixed_columns(
        export: Export, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".fleetgen-run").write_text("none\n")
    (out / "results.jsonl").write_bytes(b"")
    (out / "rejected.jsonl").write_bytes(
        orjson.dumps({"id": "x", "reason": "prompt_too_long: 9000", "line": 1}) + b"\n")
    (out / "summary.json").write_bytes(orjson.dumps({"complete": True, "finished_at": 1.0}))
    assert export(out, "--format", "parquet").code == 0
    table = pq.read_table(out / "export.parquet")
    assert table.num_rows == 0
    assert table.schema.names == ["id", "completion", "finish_reason", "prompt_tokens",
                                  "completion_tokens", "cached_tokens", "max_tokens",
                                  "latency_s", "attempts", "worker", "line"]


def test_the_declared_columns_are_fleetgens_fields() -> None:
    """A column typed by fleetgen is one of its result fields (a row's field of that name is
    under `shadowed`, so a user's text never meets a declared int column)."""
    assert set(parquet.DECLARED) <= RESULT_FIELDS
    assert set(parquet.ALWAYS) <= set(parquet.DECLARED)
