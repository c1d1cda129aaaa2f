"""Settings declared once: every `FLEETGEN_*` environment variable, every run option, and the
one renderer of their docs tables."""
