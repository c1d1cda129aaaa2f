"""A generated table in a docs page: the lines between `<!-- NAME -->` and `<!-- /NAME -->`
are replaced by what a table module renders, everything else is left as written. The one
fill/check/command of tools/envvars_table.py and tools/options_table.py, and the two tables
(each rendered by its own module, fleetgen/settings/table.py the renderer of both).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # a tool runs as `python tools/NAME.py`: this checkout's fleetgen
from fleetgen.settings import envvars, runoptions  # noqa: E402

EXIT_OK, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2


@dataclass(frozen=True)
class DocTable:
    marker: str  # the block's name: <!-- marker --> ... <!-- /marker -->
    render: Callable[[], str]
    doc: Path  # the page it fills by default
    source: str  # where the table is written, for the message
    tool: str  # the command that fills it, for the message

    @property
    def block(self) -> re.Pattern[str]:
        return re.compile(rf"(<!-- {self.marker} -->\n)(?P<body>.*?)(<!-- /{self.marker} -->)",
                          re.DOTALL)

    def fill(self, text: str) -> str | None:
        """`text` with its table replaced; None when it has no marked block."""
        if not self.block.search(text):
            return None
        return self.block.sub(lambda m: m.group(1) + self.render() + m.group(3), text)

    def command(self, description: str | None) -> Callable[[Sequence[str]], int]:
        """The tool's `main(argv)`, its --help saying `description`."""
        return lambda argv: self.main(argv, description)

    def main(self, argv: Sequence[str], description: str | None) -> int:
        parser = argparse.ArgumentParser(prog=self.tool, description=description,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--check", action="store_true",
                            help="change nothing; exit 1 if the file differs from the table")
        parser.add_argument("file", nargs="?", type=Path, default=self.doc)
        args = parser.parse_args(argv)
        text = args.file.read_text()
        new = self.fill(text)
        if new is None:
            print(f"{args.file}: no <!-- {self.marker} --> block", file=sys.stderr)
            return EXIT_ERROR
        if new == text:
            return EXIT_OK
        if args.check:
            print(f"{args.file}: differs from {self.source} (run python {self.tool})",
                  file=sys.stderr)
            return EXIT_DIFFERS
        args.file.write_text(new)
        print(f"{args.file}: updated")
        return EXIT_OK



ENVVARS = DocTable("envvars", envvars.doc_table, ROOT / "docs" / "reference.md",
                   "fleetgen/settings/envvars.py", "tools/envvars_table.py")
OPTIONS = DocTable("options", runoptions.doc_table, ROOT / "docs" / "options.md",
                   "fleetgen/settings/runoptions.py", "tools/options_table.py")
