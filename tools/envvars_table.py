"""Fill docs/reference.md's table of environment variables (`<!-- envvars -->`) from
fleetgen/settings/envvars.py, as tools/doc_table.py fills a block; `--check` exits 1 if it is stale.

    python tools/envvars_table.py [--check] [FILE]
"""

import sys

from doc_table import ENVVARS, EXIT_DIFFERS, EXIT_ERROR, EXIT_OK

__all__ = ["EXIT_DIFFERS", "EXIT_ERROR", "EXIT_OK", "REFERENCE", "fill", "main"]
REFERENCE, fill, main = ENVVARS.doc, ENVVARS.fill, ENVVARS.command(__doc__)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
