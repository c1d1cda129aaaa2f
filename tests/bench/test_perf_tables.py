"""tools/perf_tables.py: the docs' tables match the tracked figures, and a table is filled
from a small JSON (fast: no bench runs here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import perf_tables  # noqa: E402


def test_docs_match_the_tracked_figures() -> None:
    # Fails when someone edits a figure by hand or reruns a bench without regenerating.
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "perf_tables.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_every_marked_table_is_in_a_file_the_tool_checks() -> None:
    # A table moved to another page (as from the README to docs/) must take the tool with it,
    # or --check would pass over it.
    checked = {p.resolve() for p in perf_tables.DOCS}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    marked = {p.resolve() for p in pages if perf_tables.BLOCK.search(p.read_text())}
    assert marked, "no <!-- perf:NAME --> block found at all"
    assert marked == checked, (sorted(map(str, marked)), sorted(map(str, checked)))


def _ordering(ratios: dict[str, list[float]]) -> dict[str, Any]:
    return {"bench": "ordering", "at": "2026-01-02T03:04:05", "run": "make bench test",
            "commit": "0123456789abcdef0123", "arguments": {"rows": 10, "seeds": 3},
            "machine": {"cpus": 2, "loadavg_1_5_15": [0.5, 0.4, 0.3]}, "ratios": ratios}


def test_fills_a_table_from_a_small_json(tmp_path: Path) -> None:
    (tmp_path / "ordering.json").write_text(json.dumps(_ordering(
        {"input order": [1.25, 1.0, 1.5], "oracle": [1.0, 1.0, 1.0]})))
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- perf:ordering -->\nstale 9.999\n<!-- /perf:ordering -->\n"
                   "after\n")
    assert perf_tables.main(["--check", "--figures", str(tmp_path), str(doc)]) == 1
    assert "stale" in doc.read_text()  # --check changes nothing
    assert perf_tables.main(["--figures", str(tmp_path), str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n<!-- perf:ordering -->\n| order |")
    assert "| input order | 1.250 | 1.250 | 1.500 | 1.500 |" in text
    assert "| oracle | 1.000 | 1.000 | 1.000 | 1.000 |" in text
    assert "make bench test, 2026-01-02, commit 0123456789ab, rows 10, seeds 3" in text
    assert "stale" not in text and text.endswith("<!-- /perf:ordering -->\nafter\n")
    assert perf_tables.main(["--check", "--figures", str(tmp_path), str(doc)]) == 0


def test_a_missing_bench_is_marked_an_unknown_table_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- perf:fleet -->\n<!-- /perf:fleet -->\n")
    assert perf_tables.main(["--figures", str(tmp_path), str(doc)]) == perf_tables.EXIT_OK
    assert "*No figures yet: bench/figures/ has no fleet.json" in doc.read_text()
    doc.write_text("<!-- perf:nonsense -->\n<!-- /perf:nonsense -->\n")
    assert perf_tables.main(["--figures", str(tmp_path), str(doc)]) == perf_tables.EXIT_ERROR
    assert "perf:nonsense" in capsys.readouterr().err
