"""The names of a drained output directory: what the drainer writes and the exporter reads."""

from __future__ import annotations

from typing import Final

from fleetgen.base.contract import KIND_FAILURE, KIND_REJECTED, KIND_RESULT

# One JSONL file per outcome kind; every input row ends in exactly one of them.
FILES: Final = {KIND_RESULT: "results.jsonl", KIND_FAILURE: "failures.jsonl",
                KIND_REJECTED: "rejected.jsonl"}
# Written first by the drainer, holding the run's name: it ties the directory to one run.
RUN_MARKER: Final = ".fleetgen-run"
SUMMARY: Final = "summary.json"
