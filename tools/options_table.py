"""Fill docs/options.md's table of run options from fleetgen/base/runoptions.py.

The table sits between `<!-- options -->` and `<!-- /options -->`; what is between the markers
is replaced, everything else is left as written. `--check` changes nothing and exits 1 when
the file differs from the table (run `python tools/options_table.py` to update it).

    python tools/options_table.py [--check] [FILE]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fleetgen.base.runoptions import COMMANDS, TABLE, RunOption  # noqa: E402

DOC = ROOT / "docs" / "options.md"
BLOCK = re.compile(r"(<!-- options -->\n)(?P<body>.*?)(<!-- /options -->)", re.DOTALL)
EXIT_OK, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2


def _cell(text: str) -> str:
    # `<` as an entity: a Markdown viewer takes `</think>` for a tag and shows nothing.
    return text.replace("|", "\\|").replace("<", "&lt;")


def _flags(option: RunOption) -> str:
    if option.flags:
        return ", ".join(f"`{flag}`" for flag in option.flags)
    return "INPUT" if option.name == "input" else "—"


def _kept(option: RunOption) -> str:
    """Where the run keeps the setting: pinned in the manifest, stored there, in summary.json."""
    where = ["pinned" if option.pinned else "manifest" if option.stored else ""]
    if option.into:
        where = [f"in `{option.into}`"]
    if option.summary:
        where.append("summary.json")
    return ", ".join(w for w in where if w) or "—"


def _commands(option: RunOption) -> str:
    return ", ".join(c for c in COMMANDS if c in option.commands) or "—"


def _row(option: RunOption) -> str:
    cells = (_flags(option), f"`{option.stored_as}`", _commands(option), _cell(option.kind),
             _cell(option.shown_default()), _kept(option), _cell(option.doc()))
    return "| " + " | ".join(cells) + " |"


def render(table: Sequence[RunOption] = TABLE) -> str:
    lines = ["| flag | setting | commands | type | default | kept | what it does |",
             "| --- | --- | --- | --- | --- | --- | --- |", *(_row(o) for o in table)]
    return "\n".join(lines) + "\n"


def fill(text: str) -> str | None:
    """`text` with its table replaced; None when it has no marked block."""
    if not BLOCK.search(text):
        return None
    return BLOCK.sub(lambda m: m.group(1) + render() + m.group(3), text)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools/options_table.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if the file differs from the table")
    parser.add_argument("file", nargs="?", type=Path, default=DOC)
    args = parser.parse_args(argv)
    text = args.file.read_text()
    new = fill(text)
    if new is None:
        print(f"{args.file}: no <!-- options --> block", file=sys.stderr)
        return EXIT_ERROR
    if new == text:
        return EXIT_OK
    if args.check:
        print(f"{args.file}: differs from fleetgen/base/runoptions.py "
              "(run python tools/options_table.py)", file=sys.stderr)
        return EXIT_DIFFERS
    args.file.write_text(new)
    print(f"{args.file}: updated")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
