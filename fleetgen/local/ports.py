"""Ports for children that cannot bind port 0 and report it (Valkey, Flower, Procfile sets):
leased outside the kernel's ephemeral range under a file lock, and checked to be ours."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import socket
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below this sit the well-known defaults of other servers (5432, 6379, 8080, 9090, ...).
LOWEST_PORT = 20000
HIGHEST_PORT = 65535
LEASE_ATTEMPTS = 200
START_ATTEMPTS = 3
# The messages a server prints when its bind fails (Valkey, Tornado, aiohttp, honcho's view).
ADDRESS_IN_USE = ("Address already in use", "address already in use", "EADDRINUSE")


class PortInUse(RuntimeError):
    """The port turned out to belong to another process: take another lease and retry."""


class NotOurServer(PortInUse):
    """Something answers on the port, but it is not the process we started."""


def lock_dir() -> Path:
    """One directory for every user's leases, so that concurrent test runs and demos of
    different users avoid each other too (sticky, like /tmp)."""
    path = Path(tempfile.gettempdir()) / "fleetgen-ports"
    if not path.is_dir():
        path.mkdir(exist_ok=True)
        with contextlib.suppress(PermissionError):  # another user made it meanwhile
            path.chmod(0o1777)
    return path


def ephemeral_range() -> tuple[int, int]:
    """The range the kernel hands out for port 0 and outgoing connections."""
    try:
        low, high = EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def candidate_ports() -> list[int]:
    """Ports no bind(0) and no outgoing connection is ever given, so a port checked free
    stays free unless a process asks for it by number (and those we lock against)."""
    low, high = ephemeral_range()
    ports = [p for p in range(LOWEST_PORT, HIGHEST_PORT + 1) if not low <= p <= high]
    # A machine whose ephemeral range covers everything: no safe ports; the lock, the bind
    # check and the retry on "address in use" still keep us from colliding.
    return ports or list(range(LOWEST_PORT, HIGHEST_PORT + 1))


class PortLease:
    """`count` consecutive ports, reserved until close() (or until this process ends)."""

    def __init__(self, port: int, count: int, lock_fds: list[int]) -> None:
        self.port = port
        self.count = count
        self._lock_fds = lock_fds

    @property
    def ports(self) -> list[int]:
        return list(range(self.port, self.port + self.count))

    def close(self) -> None:
        for fd in self._lock_fds:
            os.close(fd)  # closing the descriptor drops its flock
        self._lock_fds = []

    def __enter__(self) -> PortLease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PortLease({self.port}..{self.port + self.count - 1})"


def lease_port(host: str = "127.0.0.1", count: int = 1,
               candidates: Iterable[int] | None = None) -> PortLease:
    """Lock and check `count` consecutive ports from `candidates` (default: random ones
    outside the ephemeral range); raises PortInUse if none can be had."""
    if candidates is None:
        ports = candidate_ports()
        candidates = random.sample(ports, min(LEASE_ATTEMPTS, len(ports)))
    for base in candidates:
        if base + count - 1 > HIGHEST_PORT:
            continue
        fds = _lock_all(range(base, base + count))
        if fds is None:
            continue
        if all(port_is_free(host, p) for p in range(base, base + count)):
            return PortLease(base, count, fds)
        for fd in fds:
            os.close(fd)
    raise PortInUse(f"no {count} free port(s) on {host} outside the ephemeral range")


def _lock_all(ports: Iterable[int]) -> list[int] | None:
    """Exclusive, non-blocking flocks on every port's lock file; None if any is held."""
    fds: list[int] = []
    for port in ports:
        # Read-only is enough for flock, and lets a second user lock a file the first made.
        fd = os.open(lock_dir() / f"{port}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            for held in fds:
                os.close(held)
            return None
        fds.append(fd)
    return fds


def port_is_free(host: str, port: int) -> bool:
    """Nothing listens on host:port. SO_REUSEADDR as the servers set it: a connection of an
    earlier user in TIME_WAIT does not keep them from binding, so it must not keep us."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
        return True


def on_leased_port(start: Callable[[PortLease], T], host: str = "127.0.0.1", count: int = 1,
                   attempts: int = START_ATTEMPTS,
                   lease: Callable[..., PortLease] = lease_port) -> tuple[PortLease, T]:
    """Start a server on a fresh lease; when `start` raises PortInUse (someone bound the port
    between our check and the server's bind), it is retried on another. `start` stops what it
    started before raising. The caller closes the lease once the server is gone."""
    failures: list[str] = []
    for _ in range(attempts):
        held = lease(host=host, count=count)
        try:
            return held, start(held)
        except PortInUse as error:
            failures.append(f"{held}: {error}")
            held.close()
        except BaseException:
            held.close()
            raise
    raise PortInUse(f"{attempts} ports in a row were taken: " + "; ".join(failures))


def says_address_in_use(text: str) -> bool:
    return any(marker in text for marker in ADDRESS_IN_USE)


def listens_on(pid: int, port: int) -> bool:
    """Process `pid` itself holds a listening TCP socket on `port` (the process table's word
    on whose server answers there; Linux /proc)."""
    inodes = _listening_inodes(port)
    return bool(inodes) and bool(inodes & _socket_inodes(pid))


def _listening_inodes(port: int) -> set[int]:
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)  # header
            for line in f:
                fields = line.split()
                # local_address is ADDR:PORT in hex; state 0A is LISTEN; field 9 the inode.
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    return inodes

