"""`fleetgen sim`: the SGLang-protocol simulator (see the simulator package).

An SGLang-protocol server with real error bodies, context rules and a capacity model, for tests,
demos and dry runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetgen.cli.flags import subcommand


def add_parser(sub: Any) -> None:
    # Its flags are added when `fleetgen sim` is run: they come from the simulator, which
    # no other command imports (tests/e2e/test_run_imports.py).
    subcommand(sub, "sim", "serve simulated SGLang servers (no GPU needed)", __doc__, run,
               deferred=_add_arguments)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from fleetgen.simulator import cli

    cli.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from fleetgen.simulator import cli

    return cli.main(args)
