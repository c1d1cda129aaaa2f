"""`fleetgen sim`: the SGLang-protocol simulator (see the simulator package)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    from fleetgen.simulator import cli

    p = sub.add_parser("sim", help="serve simulated SGLang servers (no GPU needed)",
                       description="An SGLang-protocol server with real error bodies, context "
                       "rules and a capacity model, for tests, demos and dry runs.")
    cli.add_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fleetgen.simulator import cli

    return cli.main(args)
