"""fleetgen as an operator runs it: a child process (`python -m fleetgen`), or in this process
through the CLI's main for the export tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


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


def fleetgen_in(cwd: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """`fleetgen ARGS...` in `cwd` (relative paths as a user types them), which must exit 0."""
    done = subprocess.run(fleetgen_cli(*args), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@dataclass(frozen=True)
class Ran:
    """What a command run in this process left: exit code, stdout, stderr."""

    code: int
    out: str
    err: str


Export = Callable[..., Ran]  # the type of tests/exporter's `export` fixture


class Logged:
    """`fleetgen ARGS...` in the background, its output into a file rather than a pipe: a pipe
    nobody reads until the end blocks the child once it holds 64 KiB, and a child blocked on a
    log line looks exactly like one that hangs. `wait` fails with both ends of the log."""

    def __init__(self, log: Path, *args: str) -> None:
        self.log = log
        self.name = args[0]
        with log.open("wb") as sink:
            self.proc = subprocess.Popen(fleetgen_cli(*args), stdout=sink,
                                         stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float, *, also: Callable[[], str] = str) -> str:
        """Its exit 0 within `timeout_s`, then its output; else kill it and fail with its log
        (first and last lines) and what `also` says of the run at that moment."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            where = also()
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"fleetgen {self.name} still running after {timeout_s} s; "
                                 f"{where}\n{_ends(self.text())}") from None
        assert code == 0, f"fleetgen {self.name} exited {code}:\n{_ends(self.text())}"
        return self.text()


def _ends(text: str, lines: int = 40) -> str:
    rows = text.splitlines()
    if len(rows) <= 2 * lines:
        return text
    return "\n".join([*rows[:lines], f"[... {len(rows) - 2 * lines} lines ...]", *rows[-lines:]])
