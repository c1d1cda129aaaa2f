"""Port leases: never the same port twice at once (threads or processes), never a port someone
listens on, a retry when a server finds its port taken, and probes that know our servers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

import fleetgen.local.valkey
from fleetgen.local.ports import (
    NotOurServer,
    PortInUse,
    PortLease,
    ephemeral_range,
    lease_port,
    listens_on,
    on_leased_port,
)
from fleetgen.local.simgpus import sim_ports_reported
from fleetgen.local.valkey import EmbeddedValkey, probe_valkey

# A child that leases ports and holds them until its stdin closes.
HOLDER = """
import sys
from fleetgen.local.ports import lease_port
count, candidates = int(sys.argv[1]), [int(p) for p in sys.argv[2:]] or None
leases = [lease_port(candidates=candidates) for _ in range(count)]
print(" ".join(str(held.port) for held in leases), flush=True)
sys.stdin.read()
"""


@pytest.fixture()
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def hold_in_child(started: list[subprocess.Popen[str]], count: int,
                  candidates: list[int] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(count),
                             *map(str, candidates or [])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    started.append(proc)
    return proc


def held_ports(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"lease holder exited with {proc.wait()}"
    return [int(p) for p in line.split()]


def listener(port: int) -> socket.socket:
    """A foreign server: listens on `port` without any lease."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def some_free_ports(count: int) -> list[int]:
    """Ports nobody holds or listens on right now (released again at once)."""
    leases = [lease_port() for _ in range(count)]
    for held in leases:
        held.close()
    return [held.port for held in leases]


def test_leases_held_at_once_in_threads_never_share_a_port() -> None:
    low, high = ephemeral_range()
    shared = some_free_ports(20)
    # Every thread walks the same list in the same order: only the locks keep them apart.
    with ThreadPoolExecutor(8) as pool:
        leases = list(pool.map(lambda _: lease_port(candidates=shared), range(20)))
    try:
        assert sorted(held.port for held in leases) == sorted(shared)
        with pytest.raises(PortInUse):  # all 20 are held
            lease_port(candidates=shared)
    finally:
        for held in leases:
            held.close()
    assert not any(low <= p <= high for p in shared), "a port the kernel may hand out"


def test_leases_held_at_once_in_processes_never_share_a_port(
        holders: list[subprocess.Popen[str]]) -> None:
    shared = some_free_ports(24)
    children = [hold_in_child(holders, 6, shared) for _ in range(3)]
    with ThreadPoolExecutor(1) as pool:  # this process takes its six meanwhile
        mine = pool.submit(lambda: [lease_port(candidates=shared) for _ in range(6)])
        ports = [p for child in children for p in held_ports(child)]
        leases = mine.result()
    try:
        ports += [held.port for held in leases]
        assert sorted(ports) == sorted(shared)
    finally:
        for held in leases:
            held.close()


def test_a_port_leased_by_another_process_is_skipped_until_released(
        holders: list[subprocess.Popen[str]]) -> None:
    with lease_port() as first, lease_port() as second:  # two ports nobody else holds
        wanted, spare = first.port, second.port
    child = hold_in_child(holders, 1, [wanted])
    assert held_ports(child) == [wanted]
    # Nothing listens on `wanted`: only the other process's lock keeps us off it.
    with lease_port(candidates=[wanted, spare]) as held:
        assert held.port == spare
    child.kill()
    child.wait()
    with lease_port(candidates=[wanted]) as held:  # its lock died with it
        assert held.port == wanted


def test_a_lease_skips_a_port_a_foreign_server_listens_on() -> None:
    with lease_port(count=2) as pair:
        taken, free = pair.ports
    with listener(taken):
        with lease_port(candidates=[taken, free]) as held:
            assert held.port == free
        with pytest.raises(PortInUse):
            lease_port(candidates=[taken])


def test_a_block_lease_needs_every_port_of_the_block_free() -> None:
    with lease_port(count=3) as block:
        base = block.port
    with listener(base + 2), pytest.raises(PortInUse):
        lease_port(count=3, candidates=[base])


def test_on_leased_port_retries_on_another_port_and_releases_the_taken_one() -> None:
    tried: list[int] = []

    def start(held: PortLease) -> str:
        tried.append(held.port)
        if len(tried) == 1:
            raise PortInUse("someone bound it between our check and our bind")
        return "serving"

    lease, result = on_leased_port(start)
    with lease:
        assert result == "serving" and len(tried) == 2 and lease.port == tried[1]
        with lease_port(candidates=[tried[0]]) as again:  # the failed lease was closed
            assert again.port == tried[0]


def test_on_leased_port_gives_up_after_its_attempts() -> None:
    def start(held: PortLease) -> None:
        raise PortInUse(f"{held.port} taken")

    with pytest.raises(PortInUse, match="3 ports in a row"):
        on_leased_port(start, attempts=3)


def test_listens_on_names_the_process_that_holds_the_listener() -> None:
    with lease_port() as held, listener(held.port):
        assert listens_on(os.getpid(), held.port)
        assert not listens_on(os.getppid(), held.port)
    assert not listens_on(os.getpid(), held.port)  # closed: nobody listens


def test_the_valkey_probe_refuses_a_valkey_that_is_not_ours(valkey: EmbeddedValkey,
                                                            tmp_path: Path) -> None:
    second = EmbeddedValkey(tmp_path / "second").start()
    try:
        assert second.proc is not None and valkey.proc is not None
        client = redis.Redis.from_url(second.url, socket_timeout=2)
        assert probe_valkey(client, second.proc.pid)
        # Asked for the session's server, the probe must not accept the second one.
        with pytest.raises(NotOurServer, match=f"process {second.proc.pid}"):
            probe_valkey(client, valkey.proc.pid)
        # And a Valkey told to use a port a foreign Valkey serves fails instead of taking
        # that server for its own.
        intruder = EmbeddedValkey(tmp_path / "intruder", port=second.port)
        with pytest.raises(PortInUse):
            intruder.start(timeout_s=10)
        assert intruder.proc is not None and intruder.proc.poll() is not None
    finally:
        second.stop()


def test_the_valkey_probe_refuses_a_server_that_wants_another_password(
        tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path / "locked", password="theirs").start()
    try:
        assert server.proc is not None
        wrong = redis.Redis.from_url(server.url.replace("theirs", "ours"), socket_timeout=2)
        with pytest.raises(NotOurServer):
            probe_valkey(wrong, server.proc.pid)
    finally:
        server.stop()


def test_embedded_valkey_moves_to_another_port_when_its_lease_is_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a lease cannot close alone: a process binds the port by number after our
    check. Valkey fails to bind; start() takes another lease."""
    foreign: list[socket.socket] = []

    def lease_then_lose_it(**kwargs: Any) -> PortLease:
        held = lease_port(**kwargs)
        if not foreign:
            foreign.append(listener(held.port))
        return held

    monkeypatch.setattr(fleetgen.local.valkey, "lease_port", lease_then_lose_it)
    server = EmbeddedValkey(tmp_path / "valkey")
    try:
        server.start()
        taken = foreign[0].getsockname()[1]
        assert server.port != taken and server.proc is not None
        assert probe_valkey(redis.Redis.from_url(server.url), server.proc.pid)
        assert "Address already in use" in server.log_path.read_text()
    finally:
        server.stop()
        foreign[0].close()


def test_a_killed_embedded_valkey_restarts_on_its_port_and_stop_releases_it(
        tmp_path: Path) -> None:
    server = EmbeddedValkey(tmp_path / "valkey").start()
    port = server.port
    try:
        with pytest.raises(PortInUse):  # held while the server may come back
            lease_port(candidates=[port])
        server.kill()
        server.start()
        assert server.port == port
    finally:
        server.stop()
    with lease_port(candidates=[port]) as held:
        assert held.port == port


@pytest.mark.parametrize(("line", "ports"), [
    ("fleetgen sim: serving 1 server(s) on http://127.0.0.1:41234 (context 8192, 32 slots)",
     [41234]),
    ("fleetgen sim: serving 3 server(s) on http://127.0.0.1:30000..30002 (context 4096, 8 "
     "slots)", [30000, 30001, 30002]),
    ("fleetgen sim: serving 2 server(s) on http://127.0.0.1:41234, http://127.0.0.1:39999 "
     "(context 8192, 4 slots)", [41234, 39999]),
    ("INFO starting\n", []),
])
def test_simulator_ports_come_from_its_ready_line(line: str, ports: list[int]) -> None:
    assert sim_ports_reported("some log line\n" + line + "\n") == ports


def test_a_restarted_valkey_is_ready_only_once_its_data_is_loaded(tmp_path: Path) -> None:
    """INFO is answered while the AOF loads, every other command gets -LOADING: start() must
    not return before (the resumed demo failed with 'Valkey is loading the dataset')."""
    server = EmbeddedValkey(tmp_path / "v", appendfsync="no").start()
    try:
        client = redis.Redis.from_url(server.url)
        value = b"x" * 4096
        for first in range(0, 40_000, 2_000):  # ~160 MB of AOF: loading takes a while
            pipe = client.pipeline(transaction=False)
            for key in range(first, first + 2_000):
                pipe.set(f"k{key}", value)
            pipe.execute()
        client.close()
        server.kill()
        server.start(timeout_s=60)
        # Right after start() returns, the data is there and commands are served.
        assert redis.Redis.from_url(server.url).dbsize() == 40_000
        log = server.log_path.read_text()
        assert "DB loaded from append only file" in log or "Done loading" in log, log[-2000:]
    finally:
        server.stop()


def test_an_embedded_valkey_serves_from_a_relative_data_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # valkey-server changes into --dir before it opens --logfile: a relative pair made it
    # look for out/demo/.fleetgen-demo/out/demo/.fleetgen-demo/valkey.log and exit (the
    # README's `make demo`, whose default --out is relative).
    monkeypatch.chdir(tmp_path)
    server = EmbeddedValkey(Path("out/demo/.state")).start()
    try:
        assert redis.Redis.from_url(server.url).ping()
        assert (tmp_path / "out/demo/.state/valkey.log").stat().st_size > 0
    finally:
        server.stop()
