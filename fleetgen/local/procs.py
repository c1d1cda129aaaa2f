"""Child processes of the demo and the tests: start with logs to files, stop them all, always."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx


class Child:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log_path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)


class ProcessGroup:
    """Every process it starts is stopped by stop_all(): SIGTERM, a grace period, SIGKILL."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        log = log_path.open("ab")
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def stop_all(self, grace_s: float = 15.0) -> None:
        for child in reversed(self.children):
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            try:
                child.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                child.signal(signal.SIGKILL)
                child.proc.wait()
        self.children.clear()


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """GET `url` answers 200 (readiness probes of simulators, Flower, engines)."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str,
             poll_s: float = 0.05, check: Callable[[], None] | None = None) -> None:
    """Wait on a condition with a deadline (never a bare sleep as synchronisation)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check:
            check()
        if condition():
            return
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")


def dying_with_parent(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGTERM when the thread that started it ends, the whole
    command SIGKILLed included (Slurm's KillWait, the OOM killer): a child in a session of its
    own is otherwise out of reach of whatever killed its parent. util-linux's setpriv where
    there is one (Linux's PR_SET_PDEATHSIG, kept across the exec)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]


def celery_worker_argv(name: str, concurrency: int | None, loglevel: str = "INFO",
                       task_events: bool = False) -> list[str]:
    """`concurrency` None: no -c, the worker sizes its pool from its server (K + 1)."""
    # -E: task events from the first task, for a fleet Flower watches from its start (Flower
    # would turn them on itself at its first broadcast, missing what ran before it).
    pool = [] if concurrency is None else ["-c", str(concurrency)]
    return python_argv("-m", "celery", "-A", "workers", "worker", "-Q", "fleetgen",
                       "-n", f"{name}@%h", "-P", "threads", *pool,
                       "--without-mingle", "--without-gossip", "-l", loglevel,
                       *(["-E"] if task_events else []))
