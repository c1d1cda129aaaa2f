"""Floor 1, the base: the wire contract, Redis, Celery configuration, run state, exit codes,
errors and outcome records. Every running process depends on it; it imports nothing above."""
