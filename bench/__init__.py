"""Benchmarks run by `make bench` (python -m bench): fleet, producer, drainer, memory, ceiling."""
