"""`fleetgen sim`: the SGLang-protocol simulator (see the simulator package).

An SGLang-protocol server with real error bodies, context rules and a capacity model, for tests,
demos and dry runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetgen.cli.flags import subcommand


def add_parser(sub: Any) -> None:
    from fleetgen.simulator import cli

    p = subcommand(sub, "sim", "serve simulated SGLang servers (no GPU needed)", __doc__, run)
    cli.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from fleetgen.simulator import cli

    return cli.main(args)
