"""Reading an output directory (by the names the drainer shares, fleetgen/records/outdir.py): input
order, and a snapshot that a drainer still writing (or rewriting failures.jsonl) does not
disturb."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from fleetgen.exporter.source import DrainedRun
from fleetgen.queue.contract import KINDS
from tests.support.outdir import result


def test_lines_written_after_opening_are_not_read(drained: Path) -> None:
    with DrainedRun(drained) as source:
        with (drained / "results.jsonl").open("ab") as f:  # the drainer goes on writing
            f.write(orjson.dumps(result({"prompt": "late"}, "late", 99, "x")) + b"\n")
        # ... and rewrites failures.jsonl (temp file + rename) without two of its rows
        failures = (drained / "failures.jsonl").read_bytes().splitlines(keepends=True)
        (drained / "failures.tmp").write_bytes(b"".join(failures[2:]))
        os.replace(drained / "failures.tmp", drained / "failures.jsonl")
        index = source.index(KINDS)
        outcomes = [o for group in index.groups() for o in group]
    assert [o.record["line"] for o in outcomes] == [1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 9, 9, 10,
                                                   10, 11, 12, 13, 14]
    assert index.superseded == 1  # line 14's failure under its result
    assert [o.kind for o in outcomes if o.record["line"] in (10, 14)] == [
        "result", "failure", "result"]
    assert [o.record.get("sample") for o in outcomes if o.record["line"] == 9] == [0, 1, 2]
