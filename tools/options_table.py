"""Fill docs/options.md's table of run options (`<!-- options -->`) from
fleetgen/settings/runoptions.py, as tools/doc_table.py fills a block; `--check` exits 1 if it is
stale.

    python tools/options_table.py [--check] [FILE]
"""

import sys

from doc_table import EXIT_DIFFERS, EXIT_ERROR, EXIT_OK, OPTIONS

__all__ = ["DOC", "EXIT_DIFFERS", "EXIT_ERROR", "EXIT_OK", "fill", "main"]
DOC, fill, main = OPTIONS.doc, OPTIONS.fill, OPTIONS.command(__doc__)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
