"""The README is an introduction (issue 33, point 7): at most 250 lines, `make demo` then
`make test` first, and the reference it sends readers to, docs/reference.md, lists every
command the CLI has and every exit code it uses."""

from __future__ import annotations

import re
from pathlib import Path

from fleetgen.base import exitcodes
from fleetgen.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"
MAX_LINES = 250


def section(text: str, heading: str) -> str:
    """The body of the `## heading` section of a page, up to the next heading of its level."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


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


def test_the_reference_lists_every_command() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert sub.choices is not None
    commands = set(sub.choices)
    assert {"demo", "run", "produce", "drain", "export", "doctor"} <= commands
    table = section(REFERENCE.read_text(), "Commands")
    listed = set(re.findall(r"^\| `fleetgen ([a-z]+)", table, re.MULTILINE))
    assert listed == commands, (sorted(commands - listed), sorted(listed - commands))


def test_the_reference_lists_every_exit_code() -> None:
    codes = {v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    assert {0, 1, 3, 4, 70} <= codes
    table = section(REFERENCE.read_text(), "Exit codes")
    listed = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert listed == codes, (sorted(codes - listed), sorted(listed - codes))
