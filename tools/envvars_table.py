"""Fill docs/reference.md's table of environment variables (`<!-- envvars -->`) from
fleetgen/base/envvars.py, as tools/doc_table.py fills a block; `--check` exits 1 if it is stale.

    python tools/envvars_table.py [--check] [FILE]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fleetgen.base.envvars import TABLE, EnvVar  # noqa: E402
from tools.doc_table import EXIT_DIFFERS, EXIT_ERROR, EXIT_OK, DocTable  # noqa: E402

REFERENCE = ROOT / "docs" / "reference.md"
__all__ = ["EXIT_DIFFERS", "EXIT_ERROR", "EXIT_OK", "fill", "main", "render"]


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


DOC_TABLE = DocTable("envvars", render, REFERENCE, "fleetgen/base/envvars.py",
                     "tools/envvars_table.py")
fill = DOC_TABLE.fill


def main(argv: Sequence[str]) -> int:
    return DOC_TABLE.main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
