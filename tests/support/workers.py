"""Test helper: a real Celery worker process against a given engine URL, logging to a file."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from fleetgen.queue.contract import worker_key


def start_worker(redis_url: str, engine_url: str, name: str, log: Path, *,
                 concurrency: int | None = None, env: dict[str, str] | None = None,
                 ) -> subprocess.Popen[bytes]:
    """`celery -A workers worker` as fleetgen runs it; without `concurrency`, no -c."""
    argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "-Q", "fleetgen",
            "-n", f"{name}@%h", "-P", "threads", "--without-mingle", "--without-gossip",
            "-l", "INFO"]
    if concurrency is not None:
        argv += ["-c", str(concurrency)]
    full_env = {"PATH": "/usr/bin:/bin", "FLEETGEN_REDIS_URL": redis_url,
                "FLEETGEN_ENGINE_URL": engine_url, "FLEETGEN_HEALTH_INTERVAL_S": "0.5",
                **(env or {})}
    return subprocess.Popen(argv, env=full_env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def heartbeat_key(name: str) -> str:
    return worker_key(f"{name}@{socket.gethostname()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=60)


def assert_one_line_exit(log: Path, code: int | None, expected: int, names: str) -> None:
    """A worker that refused to start: exit `expected`, no traceback, one `fleetgen worker:`
    line that names `names` (the setting or the cause)."""
    text = log.read_text()
    assert code == expected, text
    assert "Traceback" not in text
    lines = [ln for ln in text.splitlines() if ln.startswith("fleetgen worker:")]
    assert len(lines) == 1 and names in lines[0], text
