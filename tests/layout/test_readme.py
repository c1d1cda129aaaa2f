"""The README is an introduction (issue 33, point 7): at most 250 lines, with `make demo` then
`make test` first; the reference is in docs/ (tests/layout/test_reference.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250


def test_the_readme_is_an_introduction() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; the reference is docs/"
    assert len(lines) >= 50  # and still an introduction, not a stub


def test_make_demo_then_make_test_are_the_first_commands() -> None:
    # .ci/run runs them in this order, as a user on a fresh clone does.
    text = README.read_text()
    first_block = re.search(r"^```\w*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]
    assert text.index("make demo") < text.index("make test") < text.index("fleetgen run ")
