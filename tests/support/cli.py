"""fleetgen as an operator runs it: a child process (`python -m fleetgen`), or in this process
through the CLI's main for the export tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass


def fleetgen_cli(*args: str) -> list[str]:
    """The argv of `fleetgen ARGS...` in this venv."""
    return [sys.executable, "-m", "fleetgen", *args]


def cli(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """`fleetgen ARGS...` to its end, whatever its exit code (the caller checks it)."""
    return subprocess.run(fleetgen_cli(*args), capture_output=True, text=True,
                          timeout=timeout_s, env=dict(os.environ))


def fleetgen(*args: str) -> subprocess.CompletedProcess[str]:
    """`fleetgen ARGS...`, which must exit 0 (its output is the failure's message)."""
    done = cli(*args, timeout_s=180)
    assert done.returncode == 0, f"fleetgen {args[0]}: {done.stdout}{done.stderr}"
    return done


@dataclass(frozen=True)
class Ran:
    """What a command run in this process left: exit code, stdout, stderr."""

    code: int
    out: str
    err: str


Export = Callable[..., Ran]  # the type of tests/exporter's `export` fixture
