"""A worker process's state, in one place as Celery keeps its own (celery/worker/state.py):
what start-up configures (node name, pool size, protocol, settings), what the tasks count
(prompts in flight, dropped tasks of purged runs, the engine's silence), what shutdown needs
(the consumer whose channel holds the unacked messages) and the runtime built from it.
`reset()` puts it back as a new process has it (tests that run worker code in their own
process)."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from workers.silence import Silence

# The pool size until Celery reports its own (configure): the engine client's pool limits.
DEFAULT_CONCURRENCY = 16


@dataclass
class WorkerState:
    worker_name: str = field(default_factory=lambda: f"worker@{socket.gethostname()}")
    concurrency: int = DEFAULT_CONCURRENCY
    settings: Any = None  # WorkerSettings, read from the environment once
    protocol: Any = None  # the engine protocol resolved at start-up (or first use)
    runtime: Any = None  # workers.runtime.Runtime, built on first use
    consumer: Any = None  # Celery's consumer, for the hand-back at shutdown
    pacing: Any = None  # workers.pacing.InFlightLimit: the in-flight limit, set at start-up
    inflight: int = 0  # prompts this process is working on (published with the heartbeat)
    dropped: dict[str, int] = field(default_factory=dict)  # per run, tasks of purged runs
    # Since when the engine has answered nothing while requests time out (the heartbeat's
    # `silent_s`, which the engine's supervisor reads).
    silence: Silence = field(default_factory=Silence)
    lock: threading.Lock = field(default_factory=threading.Lock)  # builds and counters


state = WorkerState()


def reset() -> None:
    """The state of a process that has not started a worker yet."""
    state.__init__()  # type: ignore[misc]
