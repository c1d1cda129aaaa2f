"""Fill the table of environment variables in docs/reference.md from fleetgen/base/envvars.py.

The table sits between `<!-- envvars -->` and `<!-- /envvars -->`; what is between the markers
is replaced, everything else is left as written. `--check` changes nothing and exits 1 when
the file differs from the table (run `python tools/envvars_table.py` to update it).

    python tools/envvars_table.py [--check] [FILE]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fleetgen.base.envvars import TABLE, EnvVar  # noqa: E402

REFERENCE = ROOT / "docs" / "reference.md"
BLOCK = re.compile(r"(<!-- envvars -->\n)(?P<body>.*?)(<!-- /envvars -->)", re.DOTALL)
EXIT_OK, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(var: EnvVar[object]) -> str:
    cells = (f"`{var.name}`", var.read_by, _cell(var.kind), _cell(var.shown_default()),
             var.help + (" (secret: never logged)" if var.secret else ""))
    return "| " + " | ".join(cells) + " |"


def render(table: Sequence[EnvVar[object]] = TABLE) -> str:
    lines = ["| variable | read by | type | default | what it does |",
             "| --- | --- | --- | --- | --- |", *(_row(var) for var in table)]
    return "\n".join(lines) + "\n"


def fill(text: str) -> str | None:
    """`text` with its table replaced; None when it has no marked block."""
    if not BLOCK.search(text):
        return None
    return BLOCK.sub(lambda m: m.group(1) + render() + m.group(3), text)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools/envvars_table.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if the file differs from the table")
    parser.add_argument("file", nargs="?", type=Path, default=REFERENCE)
    args = parser.parse_args(argv)
    text = args.file.read_text()
    new = fill(text)
    if new is None:
        print(f"{args.file}: no <!-- envvars --> block", file=sys.stderr)
        return EXIT_ERROR
    if new == text:
        return EXIT_OK
    if args.check:
        print(f"{args.file}: differs from fleetgen/base/envvars.py "
              "(run python tools/envvars_table.py)", file=sys.stderr)
        return EXIT_DIFFERS
    args.file.write_text(new)
    print(f"{args.file}: updated")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
