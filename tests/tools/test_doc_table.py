"""tools/doc_table.py through both generated tables' own commands: each rewrites only its
marked block, `--check` tells a stale block, a page without the block is an error. What each
table holds: tests/settings/test_envvars.py, tests/settings/test_runoptions.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import envvars_table  # noqa: E402
import options_table  # noqa: E402


@pytest.mark.parametrize(("tool", "marker", "header"), [
    (envvars_table, "envvars", "| variable |"), (options_table, "options", "| flag |")])
def test_the_tool_rewrites_only_its_block(tool: ModuleType, marker: str, header: str,
                                          tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"before\n<!-- {marker} -->\n| stale |\n<!-- /{marker} -->\nafter\n")
    assert tool.main(["--check", str(doc)]) == tool.EXIT_DIFFERS
    assert tool.main([str(doc)]) == tool.EXIT_OK
    text = doc.read_text()
    assert "stale" not in text and text.startswith(f"before\n<!-- {marker} -->\n{header}")
    assert text.endswith(f"<!-- /{marker} -->\nafter\n")
    assert tool.main(["--check", str(doc)]) == tool.EXIT_OK
    doc.write_text("no block\n")
    assert tool.main([str(doc)]) == tool.EXIT_ERROR
