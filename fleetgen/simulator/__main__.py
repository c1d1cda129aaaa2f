"""`python -m fleetgen.simulator`: the simulator CLI without the rest of fleetgen."""

from __future__ import annotations

import argparse
import logging
import sys

from fleetgen.simulator.cli import add_arguments, main


def entrypoint() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fleetgen.simulator",
        description="Serve simulated SGLang servers (native /generate, OpenAI completions, "
        "/metrics) with SGLang's limits and errors, a capacity model and fault injection.",
    )
    add_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return main(args)


if __name__ == "__main__":
    sys.exit(entrypoint())
