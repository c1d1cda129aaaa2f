"""`python -m fleetgen` is the `fleetgen` command."""

from fleetgen.cli import entrypoint

entrypoint()
