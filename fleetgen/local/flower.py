"""Flower (Celery's web UI) for a fleet, always behind basic auth (CVE-2022-30034)."""

from __future__ import annotations

import os
import secrets

from fleetgen.base.errors import ConfigError
from fleetgen.local.procs import Child, ProcessGroup, http_ok, python_argv, wait_for

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
    """Start Flower against `redis_url` and wait until it serves (/healthcheck needs no auth)."""
    env = {"FLEETGEN_REDIS_URL": redis_url, ENV_BASIC_AUTH: credentials}
    child = procs.start("flower", flower_argv(port, address), env=env)
    url = f"http://{address}:{port}"

    def check() -> None:
        if not child.alive():
            raise RuntimeError(f"flower exited:\n{child.log_text()[-2000:]}")

    wait_for(lambda: http_ok(url + "/healthcheck"), timeout_s, f"Flower at {url}", poll_s=0.2,
             check=check)
    return child
