"""The docs' tables list what the code declares: docs/reference.md every command of the CLI and
every exit code, docs/formats.md every field fleetgen writes into a result line. A command,
code or field added without its line in the docs fails here."""

from __future__ import annotations

import re
from pathlib import Path

from fleetgen import exitcodes
from fleetgen.cli.main import build_parser
from fleetgen.records import outcomes

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"
FORMATS = ROOT / "docs" / "formats.md"


def section(text: str, heading: str) -> str:
    """The body of the `## heading` section of a page, up to the next heading of its level."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


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


def test_the_output_table_names_every_field_of_a_result() -> None:
    table = section(FORMATS.read_text(), "Output (`--out DIR`, written only by the drainer)")
    (results,) = [line for line in table.splitlines() if line.startswith("| `results.jsonl`")]
    named = set(re.findall(r"[a-z_]+", " ".join(re.findall(r"`([^`]*)`", results))))
    assert {"id", "completion", "shadowed"} <= outcomes.RESULT_FIELDS
    missing = sorted(outcomes.RESULT_FIELDS - named)
    assert not missing, f"docs/formats.md's results row does not name {missing}"
