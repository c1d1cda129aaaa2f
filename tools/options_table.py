"""Fill docs/options.md's table of run options (`<!-- options -->`) from
fleetgen/base/runoptions.py, as tools/doc_table.py fills a block; `--check` exits 1 if it is
stale.

    python tools/options_table.py [--check] [FILE]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fleetgen.base.runoptions import COMMANDS, TABLE, RunOption  # noqa: E402
from tools.doc_table import EXIT_DIFFERS, EXIT_ERROR, EXIT_OK, DocTable  # noqa: E402
from tools.doc_table import cell as _cell  # noqa: E402

DOC = ROOT / "docs" / "options.md"
__all__ = ["EXIT_DIFFERS", "EXIT_ERROR", "EXIT_OK", "fill", "main", "render"]


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


DOC_TABLE = DocTable("options", render, DOC, "fleetgen/base/runoptions.py",
                     "tools/options_table.py")
fill = DOC_TABLE.fill


def main(argv: Sequence[str]) -> int:
    return DOC_TABLE.main(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
