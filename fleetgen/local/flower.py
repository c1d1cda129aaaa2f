"""Flower (Celery's web UI) for a fleet, always behind basic auth (CVE-2022-30034)."""

from __future__ import annotations

import os
import secrets
import signal

from fleetgen.errors import ConfigError
from fleetgen.local.ports import PortInUse, listens_on, says_address_in_use
from fleetgen.local.procs import Child, ProcessGroup, http_ok, python_argv, wait_for
from fleetgen.settings.envvars import REDIS_URL

ENV_BASIC_AUTH = "FLOWER_BASIC_AUTH"


def basic_auth(env: dict[str, str] | None = None) -> tuple[str, bool]:
    """`user:password` from FLOWER_BASIC_AUTH, or a generated one; and whether it was made up."""
    value = (os.environ if env is None else env).get(ENV_BASIC_AUTH, "")
    if value:
        if any(":" not in pair or pair.startswith(":") for pair in value.split(",")):
            raise ConfigError(f"{ENV_BASIC_AUTH} must be user:password (comma-separated for "
                              "several users)")
        return value, False
    return f"fleetgen:{secrets.token_urlsafe(12)}", True


def flower_argv(port: int, address: str = "127.0.0.1") -> list[str]:
    # No --basic-auth here: the credentials travel in FLOWER_BASIC_AUTH (which Flower reads
    # itself), so they never show in `ps`.
    return python_argv("-m", "celery", "-A", "workers", "flower", f"--port={port}",
                       f"--address={address}", "--purge_offline_workers=60")


def start_flower(procs: ProcessGroup, redis_url: str, port: int, credentials: str,
                 address: str = "127.0.0.1", timeout_s: float = 60.0) -> Child:
    """Start Flower against `redis_url` and wait until it serves (/healthcheck needs no auth)
    from our process: PortInUse (with Flower stopped) if the port is another's."""
    env = {REDIS_URL.name: redis_url, ENV_BASIC_AUTH: credentials}
    log_path = procs.log_dir / "flower.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    child = procs.start("flower", flower_argv(port, address), env=env)
    url = f"http://{address}:{port}"

    def check() -> None:
        if child.alive():
            return
        output = log_path.read_bytes()[offset:].decode(errors="replace")
        if says_address_in_use(output):
            raise PortInUse(f"Flower could not bind {address}:{port}: address in use")
        raise RuntimeError(f"flower exited:\n{output[-2000:]}")

    def ours_and_serving() -> bool:
        # An answer alone could come from another server on the port; the process table says
        # whether the listener is the Flower we started.
        return listens_on(child.proc.pid, port) and http_ok(url + "/healthcheck")

    try:
        wait_for(ours_and_serving, timeout_s, f"Flower at {url}", poll_s=0.2, check=check)
    except BaseException:
        child.signal(signal.SIGKILL)
        child.proc.wait()
        raise
    return child

