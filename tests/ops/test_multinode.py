"""Multi-node: workers on two "hosts" (network namespaces joined by veth pairs and a bridge)
against a Valkey on a third, all started with the same commands as on real machines."""

from __future__ import annotations

import re
import secrets
import shutil
import signal
import subprocess
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from fleetgen.local.ports import PortInUse, PortLease, on_leased_port, says_address_in_use
from fleetgen.local.procs import Child, ProcessGroup
from fleetgen.local.simgpus import sim_ports_reported
from fleetgen.local.valkey import probe_valkey
from tests.support.content import assert_content, sim_config
from tests.support.ops import VENV_BIN, venv_env
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.waiting import wait_until

NODES = ("node-a", "node-b")
SUBNET = "10.213.47"  # a private /24 that exists only between the namespaces made here


@dataclass
class Topology:
    """Where each role runs: a namespace per host (netns), or distinct loopback addresses."""

    kind: str
    redis_host: str
    engine_hosts: dict[str, str]
    engine_ports: dict[str, int]
    namespaces: dict[str, str] = field(default_factory=dict)  # role -> netns name

    def argv(self, role: str, argv: list[str]) -> list[str]:
        ns = self.namespaces.get(role)
        return ["ip", "netns", "exec", ns, *argv] if ns else argv


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _netns_topology(tag: str) -> Topology:
    names = {"redis": f"fg{tag}r", NODES[0]: f"fg{tag}a", NODES[1]: f"fg{tag}b"}
    for ns in names.values():
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
    redis_ns = names["redis"]
    _ip("-n", redis_ns, "link", "add", "br0", "type", "bridge")
    _ip("-n", redis_ns, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
    _ip("-n", redis_ns, "link", "set", "br0", "up")
    for i, node in enumerate(NODES):
        # The pair is made inside the host's namespace, its peer moved straight into the
        # Valkey host's: no interface ever exists in the machine's own namespace.
        _ip("-n", names[node], "link", "add", "eth0", "type", "veth", "peer", "name",
            f"v{i}", "netns", redis_ns)
        _ip("-n", names[node], "addr", "add", f"{SUBNET}.{i + 2}/24", "dev", "eth0")
        _ip("-n", names[node], "link", "set", "eth0", "up")
        _ip("-n", redis_ns, "link", "set", f"v{i}", "master", "br0")
        _ip("-n", redis_ns, "link", "set", f"v{i}", "up")
    # Each host has its own loopback, so both servers use the same port, as on real nodes.
    return Topology("netns", f"{SUBNET}.1", dict.fromkeys(NODES, "127.0.0.1"),
                    dict.fromkeys(NODES, 30000), names)


def _loopback_topology() -> Topology:
    hosts = {NODES[0]: "127.0.0.3", NODES[1]: "127.0.0.4"}
    # Port 0: the simulators bind ports of the kernel's choosing and report them.
    return Topology("loopback", "127.0.0.2", hosts, dict.fromkeys(NODES, 0))


def _start_valkey(topology: Topology, procs: ProcessGroup, data_dir: Path,
                  password: str) -> tuple[str, PortLease | None]:
    """Valkey on its host: 6379 in a namespace of its own, where nothing else can be; on a
    shared loopback a leased port, checked to be served by our process (and moved if not)."""

    def start(port: int) -> tuple[Child, str]:
        url = f"redis://:{password}@{topology.redis_host}:{port}/0"
        child = procs.start(f"valkey-{port}", topology.argv("redis", [
            str(VENV_BIN / "fleetgen"), "valkey", "--dir", str(data_dir), "--bind",
            topology.redis_host, "--port", str(port)]), env=venv_env(FLEETGEN_REDIS_URL=url))
        return child, url

    if topology.kind == "netns":
        return start(6379)[1], None

    def start_ours(held: PortLease) -> str:
        child, url = start(held.port)
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)

        def check() -> None:
            if not child.alive():
                log = child.log_text()
                raise (PortInUse if says_address_in_use(log) else RuntimeError)(log[-2000:])

        try:
            wait_until(lambda: probe_valkey(client, child.proc.pid), 30, "Valkey", check=check)
        except BaseException:
            child.signal(signal.SIGKILL)
            child.proc.wait()
            raise
        return url

    lease, url = on_leased_port(start_ours, host=topology.redis_host)
    return url, lease


def _engine_url(topology: Topology, node: str, sim: Child) -> str:
    """Where the simulator of `node` serves: its fixed port, or the one its ready line names."""
    host, port = topology.engine_hosts[node], topology.engine_ports[node]
    if not port:
        reported: list[int] = []

        def ready() -> bool:
            reported[:] = sim_ports_reported(sim.log_text())
            return bool(reported) or not sim.alive()

        wait_until(ready, 30, f"the simulator on {node} to report its port")
        assert reported, sim.log_text()[-2000:]
        port = reported[0]
    return f"http://{host}:{port}"


@pytest.fixture()
def topology() -> Iterator[Topology]:
    tag = secrets.token_hex(3)  # namespaces of concurrent test runs never collide
    reason = None
    if shutil.which("ip") is None:
        reason = "the `ip` command is missing"
    topo = None
    if reason is None:
        try:
            topo = _netns_topology(tag)
        except subprocess.CalledProcessError as exc:
            reason = f"`ip {' '.join(exc.cmd[1:])}` failed: {exc.stderr.decode().strip()}"
    if topo is None:
        warnings.warn(f"network namespaces not permitted ({reason}); multi-node test falls "
                      "back to distinct loopback addresses", stacklevel=1)
        topo = _loopback_topology()
    try:
        yield topo
    finally:
        for ns in topo.namespaces.values():  # processes are stopped by then (see the test)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


SIM_FLAGS = ["--context-length", "4096", "--max-running-requests", "8", "--ttft-ms", "10",
             "--tpot-ms", "1", "--output-tokens-mean", "100"]


def test_workers_on_two_hosts_share_one_valkey(topology: Topology, tmp_path: Path) -> None:
    password = secrets.token_urlsafe(16)
    fleetgen = str(VENV_BIN / "fleetgen")
    procs = ProcessGroup(tmp_path / "logs")
    lease = None
    try:
        # The Valkey host: reachable from the others, so a password is required.
        url, lease = _start_valkey(topology, procs, tmp_path / "valkey", password)
        env = venv_env(FLEETGEN_REDIS_URL=url)
        for node in NODES:
            host, engine_port = topology.engine_hosts[node], topology.engine_ports[node]
            sim = procs.start(f"sim-{node}", topology.argv(node, [
                fleetgen, "sim", "--host", host, "--port", str(engine_port), *SIM_FLAGS]),
                env=env)
            procs.start(f"worker-{node}", topology.argv(node, [
                str(VENV_BIN / "celery"), "-A", "workers", "worker", "-Q", "fleetgen",
                "-n", f"gpu0@{node}", "-P", "threads", "-c", "8", "-l", "WARNING"]),
                env={**env, "FLEETGEN_ENGINE_URL": _engine_url(topology, node, sim),
                     "FLEETGEN_HEALTH_INTERVAL_S": "0.5"})

        def on_redis_host(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
            result = subprocess.run(topology.argv("redis", [fleetgen, *args]), env=env,
                                    capture_output=True, text=True, timeout=timeout_s)
            assert result.returncode == 0, (
                f"fleetgen {args[0]} failed ({result.returncode}): {result.stdout}"
                f"{result.stderr}\n" + "\n".join(c.log_text()[-1500:] for c in procs.children))
            return result

        # Both remote workers are up, healthy and heartbeating, seen from the Valkey host.
        for node in NODES:
            on_redis_host("check", "--wait-s", "60", "--worker", f"gpu0@{node}")
        prompts = tmp_path / "prompts.jsonl"
        kinds = make_prompts(prompts, 80, seed=9)
        on_redis_host("produce", str(prompts), "--run", "multinode", "--context-length",
                      "4096", "--max-output-tokens", "256")
        summary = on_redis_host("drain", "--run", "multinode", "--out", str(tmp_path / "out"))
        assert re.search(r"^  complete\s+yes$", summary.stdout, re.M), summary.stdout
        data = assert_exactly_once(tmp_path / "out", set(kinds["good"]))
        assert assert_content(data["results"], prompts, sim_config(SIM_FLAGS)) == 80
        by_worker = Counter(r["worker"] for r in data["results"])
        assert set(by_worker) == {f"gpu0@{n}" for n in NODES}, by_worker
        assert not data["failures"]
        for child in procs.children:
            assert password not in child.log_text(), f"password in {child.name}'s log"
    finally:
        procs.stop_all()
        if lease is not None:
            lease.close()
