"""fleetgen: exact-budget, exactly-once completion generation on a fleet of SGLang servers."""

__version__ = "0.1.0"
