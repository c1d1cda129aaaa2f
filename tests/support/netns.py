"""Hosts as network namespaces on one bridge, and a network cut between them: the switch port
of a host set down (tests/ops/test_partition.py; tests/ops/test_multinode.py builds the same
shape for a run without faults).

The Valkey host's namespace holds the bridge and every host's switch port (the veth peer of its
eth0). Neighbour entries are permanent, so a cut is a silent blackhole, as a dead switch port
or a pulled cable: no RST, no ARP failure, packets simply gone (the kernel has no netem). The
test process reaches the bridge through a management port of its own, which is never cut, to
read Valkey while the hosts are cut off from it."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

VALKEY = "valkey"


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True,
                          timeout=10).stdout


def _mac(ns: str | None, dev: str) -> str:
    where = ["-n", ns] if ns else []
    return str(json.loads(ip(*where, "-j", "link", "show", "dev", dev))[0]["address"])


@dataclass
class Hosts:
    """Namespaces `<prefix><tag><letter>`: the Valkey host and one per node."""

    subnet: str
    ns: dict[str, str]  # role (VALKEY or a node name) -> namespace
    ports: dict[str, str] = field(default_factory=dict)  # node -> its switch port
    management: str = ""  # the root namespace's port on the bridge

    @property
    def valkey_address(self) -> str:
        return f"{self.subnet}.1"

    def argv(self, role: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[role], *argv]

    def cut(self, *nodes: str) -> None:
        for node in nodes:
            ip("-n", self.ns[VALKEY], "link", "set", self.ports[node], "down")

    def heal(self, *nodes: str) -> None:
        for node in nodes:
            ip("-n", self.ns[VALKEY], "link", "set", self.ports[node], "up")

    def is_cut(self, node: str) -> bool:
        state = json.loads(ip("-n", self.ns[VALKEY], "-j", "link", "show", "dev",
                              self.ports[node]))[0]
        return "UP" not in state.get("flags", [])


def _build(hosts: Hosts, nodes: tuple[str, ...], tag: str) -> None:
    valkey_ns = hosts.ns[VALKEY]
    for ns in hosts.ns.values():
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
    # An address of its own: a bridge otherwise takes its lowest port's, which changes as the
    # ports are added, and the hosts' permanent entries would name a stale one.
    ip("-n", valkey_ns, "link", "add", "br0", "address", "02:52:00:00:00:01", "type", "bridge")
    ip("-n", valkey_ns, "addr", "add", f"{hosts.subnet}.1/24", "dev", "br0")
    ip("-n", valkey_ns, "link", "set", "br0", "up")
    bridge_mac = _mac(valkey_ns, "br0")
    for i, node in enumerate(nodes):
        ns, port, address = hosts.ns[node], f"v{i}", f"{hosts.subnet}.{i + 2}"
        ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns",
           valkey_ns)
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", valkey_ns, "link", "set", port, "master", "br0")
        ip("-n", valkey_ns, "link", "set", port, "up")
        hosts.ports[node] = port
        # Permanent: a cut host's neighbour entries never expire into an ARP failure.
        ip("-n", ns, "neigh", "replace", f"{hosts.subnet}.1", "lladdr", bridge_mac, "dev",
           "eth0", "nud", "permanent")
        ip("-n", valkey_ns, "neigh", "replace", address, "lladdr", _mac(ns, "eth0"), "dev",
           "br0", "nud", "permanent")
    # The test's own way in (from the machine's namespace), on a port that is never cut.
    hosts.management = f"h52{tag}m"
    ip("link", "add", hosts.management, "type", "veth", "peer", "name", "mgmt", "netns",
       valkey_ns)
    ip("addr", "add", f"{hosts.subnet}.254/24", "dev", hosts.management)
    ip("link", "set", hosts.management, "up")
    ip("-n", valkey_ns, "link", "set", "mgmt", "master", "br0")
    ip("-n", valkey_ns, "link", "set", "mgmt", "up")


@contextmanager
def hosts_on_a_bridge(nodes: tuple[str, ...], prefix: str = "h52") -> Iterator[Hosts]:
    """The namespaces and links, removed at the end whatever happened (processes in them must
    be stopped by then)."""
    tag = secrets.token_hex(3)
    # A /24 of its own per run: the management port puts a route in the machine's table.
    subnet = f"10.52.{int(tag, 16) % 250 + 1}"
    names = {VALKEY: f"{prefix}{tag}r"} | {n: f"{prefix}{tag}{chr(ord('a') + i)}"
                                           for i, n in enumerate(nodes)}
    hosts = Hosts(subnet, names)
    try:
        _build(hosts, nodes, tag)
        yield hosts
    finally:
        if hosts.management:
            subprocess.run(["ip", "link", "del", hosts.management], capture_output=True,
                           timeout=10)
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
