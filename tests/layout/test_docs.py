"""The docs cite files of this repository that exist: a moved or renamed module fails here,
not in a reader's hands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A path into one of this repository's folders (other projects' files are cited by their
# project's name and no such folder, e.g. SGLang's `srt/...`).
TOPS = ("fleetgen", "producer", "workers", "tests", "tools", "bench",
        "docs", "compose")
CITED = re.compile(r"(?<![\w./-])((?:" + "|".join(TOPS) + r")/[\w./-]*\w)")
# docs/simulator.md is left out: it cites llama.cpp's own `tools/server/`, a folder name this
# repository shares.
DOCS = ("README.md", "docs/design.md", "docs/cluster.md", "docs/faults.md",
        "docs/performance.md")


def cited(text: str) -> set[str]:
    return {m.group(1).rstrip(".") for m in CITED.finditer(text)}


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_a_doc_cites_exists(doc: str) -> None:
    paths = cited((ROOT / doc).read_text())
    assert len(paths) >= 5  # the scan finds the citations at all
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{doc} cites files that are not in the repository: {missing}"


def test_a_missing_file_is_found() -> None:
    assert cited("see `producer/nowhere.py` and tests/e2e/, not srt/x.py") == \
        {"producer/nowhere.py", "tests/e2e"}
