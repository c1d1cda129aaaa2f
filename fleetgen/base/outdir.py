"""The names of a drained output directory: what the drainer writes and the exporter reads."""

from __future__ import annotations

from typing import BinaryIO, Final

from fleetgen.base.contract import KIND_FAILURE, KIND_REJECTED, KIND_RESULT

# One JSONL file per outcome kind; every input row ends in exactly one of them.
FILES: Final = {KIND_RESULT: "results.jsonl", KIND_FAILURE: "failures.jsonl",
                KIND_REJECTED: "rejected.jsonl"}
# Written first by the drainer, holding the run's name: it ties the directory to one run.
RUN_MARKER: Final = ".fleetgen-run"
SUMMARY: Final = "summary.json"


def whole_lines_end(f: BinaryIO, size: int) -> int:
    """The end of the last newline at or before `size` in `f`: what follows it is a torn line
    (a crash mid-write). Read backwards in 64 KiB chunks, so a huge file costs one chunk."""
    chunk = 1 << 16
    pos = size
    while pos > 0:
        start = max(0, pos - chunk)
        f.seek(start)
        data = f.read(pos - start)
        newline = data.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        pos = start
    return 0
