"""`python -m fleetgen` is the `fleetgen` command."""

from fleetgen.cli.main import entrypoint

entrypoint()
