"""Flower without a browser: basic auth on every page, and a port that is not Flower's own
is refused rather than taken for Flower."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fleetgen.local.flower import start_flower
from fleetgen.local.ports import PortInUse, lease_port
from fleetgen.local.procs import ProcessGroup
from fleetgen.local.valkey import EmbeddedValkey
from tests.support.ops import start_flower_leased


@pytest.fixture(scope="module")
def flower(valkey: EmbeddedValkey, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, tuple[str, str]]]:
    """Flower alone on the session's Valkey: the pages and their auth need no workers."""
    procs = ProcessGroup(tmp_path_factory.mktemp("flower-auth"))
    auth = ("ops", secrets.token_urlsafe(12))
    lease = None
    try:
        _, lease = start_flower_leased(procs, valkey.url, f"{auth[0]}:{auth[1]}")
        yield f"http://127.0.0.1:{lease.port}", auth
    finally:
        procs.stop_all()
        if lease is not None:
            lease.close()


def test_flower_refuses_requests_without_credentials(flower: tuple[str, tuple[str, str]]
                                                     ) -> None:
    url, auth = flower
    for path in ("/", "/workers", "/tasks", "/api/workers"):
        assert httpx.get(url + path, timeout=10).status_code == 401, path
        assert httpx.get(url + path, auth=(auth[0], "wrong"), timeout=10).status_code == 401
    assert httpx.get(url + "/workers", auth=auth, timeout=10).status_code == 200


def test_flower_on_a_port_another_server_holds_fails_with_port_in_use(
        valkey: EmbeddedValkey, flower: tuple[str, tuple[str, str]], tmp_path: Path) -> None:
    """The port answers /healthcheck (the first Flower), yet the second Flower is not the
    one listening there: its start fails, it does not report someone else's server."""
    url, auth = flower
    taken = int(url.rsplit(":", 1)[1])
    procs = ProcessGroup(tmp_path / "logs")
    try:
        with pytest.raises(PortInUse):
            start_flower(procs, valkey.url, taken, f"{auth[0]}:{auth[1]}", timeout_s=60)
        assert not procs.children[0].alive()
        # A plain listener that never answers HTTP is refused the same way.
        with lease_port() as held, socket.socket() as foreign:
            foreign.bind(("127.0.0.1", held.port))
            foreign.listen()
            with pytest.raises(PortInUse):
                start_flower(procs, valkey.url, held.port, "a:b", timeout_s=60)
    finally:
        procs.stop_all()
