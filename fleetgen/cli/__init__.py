"""Floor 6, the top: the `fleetgen` command, one module per subcommand (`main` is the parser
and the error policy). Change freely: nothing below imports it."""
