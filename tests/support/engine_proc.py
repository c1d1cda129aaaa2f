"""A real engine server the tests start (llama-server, vLLM): started on a leased port with its
output appended to a log, waited for until its readiness probe answers 200, and stopped with its
lease released; tests/support/llama.py and vllm.py say what differs (argv, probe, signals)."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import ClassVar, Self

import httpx

from fleetgen.local.ports import (
    PortInUse,
    PortLease,
    lease_port,
    on_leased_port,
    says_address_in_use,
)
from tests.support.waiting import wait_until


class EngineProcess:
    """The dataclasses that inherit it hold `log_path`, `proc`, `lease` and `port`."""

    name: ClassVar[str]  # in messages: "llama-server", "vLLM"
    ready_path: ClassVar[str]  # GET it answers 200 once it serves
    poll_s: ClassVar[float]
    start_timeout_s: ClassVar[float]  # its load and warm-up on a loaded machine
    # Besides says_address_in_use: the engine's own words for a port that is taken.
    bind_markers: ClassVar[tuple[str, ...]] = ()
    # A session (process group) of its own, to signal the engine's children with it.
    own_session: ClassVar[bool] = False

    log_path: Path
    proc: subprocess.Popen[bytes] | None
    lease: PortLease | None
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        return None  # the tests' own environment

    def start(self, timeout_s: float | None = None) -> Self:
        def start_on(lease: PortLease) -> None:
            self._start_on(lease.port, timeout_s or self.start_timeout_s)

        self.lease, _ = on_leased_port(start_on, lease=lease_port)
        return self

    def _start_on(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env(),
                                         start_new_session=self.own_session)
        try:
            self._wait_ready(timeout_s, offset)
        except BaseException:
            self.kill()
            raise

    def log_text(self, offset: int = 0) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[offset:].decode(errors="replace")

    def _wait_ready(self, timeout_s: float, offset: int) -> None:
        proc = self.proc
        assert proc is not None

        def alive() -> None:
            if proc.poll() is None:
                return
            output = self.log_text(offset)
            if says_address_in_use(output) or any(m in output for m in self.bind_markers):
                raise PortInUse(f"{self.name} could not bind port {self.port}")
            raise RuntimeError(f"{self.name} exited with {proc.returncode}:\n{output[-3000:]}")

        def ready() -> bool:
            with contextlib.suppress(httpx.TransportError):
                return client.get(f"{self.url}{self.ready_path}").status_code == 200
            return False

        with httpx.Client(timeout=2.0) as client:
            try:
                wait_until(ready, timeout_s, f"{self.name} to answer {self.ready_path}",
                           poll_s=self.poll_s, check=alive)
            except AssertionError as exc:
                raise AssertionError(f"{exc}:\n{self.log_text(offset)[-3000:]}") from None

    def kill(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.kill()
        if self.lease is not None:
            self.lease.close()
            self.lease = None
