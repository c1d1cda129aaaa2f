"""Redis connections that survive a server restart, and URLs that never leak a password."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from fleetgen.errors import ConfigError
from fleetgen.settings.envvars import REDIS_URL

# A link that died without a RST (a cut network, a host powered off) is found by TCP alone: the
# kernel's keepalive defaults probe after 2 h idle (and 11 min more), and data left unacked is
# retransmitted for ~15 min. These drop such a connection after about 25 s idle (10 s, then 3
# probes 5 s apart) or 30 s of unacknowledged data, so a client reconnects (and its user is
# told) within a beat or two of the heal, not hours later (issue 52). A live but slow Valkey
# still acknowledges at the TCP level: it is never taken for a dead one.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES, USER_TIMEOUT_S = 10, 5, 3, 30


def keepalive_options() -> dict[int, int]:
    """`socket_keepalive_options` for redis-py (and kombu's transport): what this platform
    has of them (Linux has all four; macOS names the idle time TCP_KEEPALIVE)."""
    wanted = {"TCP_KEEPIDLE": KEEPALIVE_IDLE_S, "TCP_KEEPALIVE": KEEPALIVE_IDLE_S,
              "TCP_KEEPINTVL": KEEPALIVE_INTERVAL_S, "TCP_KEEPCNT": KEEPALIVE_PROBES,
              "TCP_USER_TIMEOUT": USER_TIMEOUT_S * 1000}
    return {getattr(socket, name): value for name, value in wanted.items()
            if hasattr(socket, name)}


def redis_url(flag: str | None) -> str:
    """The --redis flag wins over FLEETGEN_REDIS_URL; the default is a local Redis."""
    url = flag or REDIS_URL.value()
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        source = "--redis" if flag else REDIS_URL.name
        raise ConfigError(f"{source} must be a redis://, rediss:// or unix:// URL, "
                          f"got {redact(url)}")
    return url


def redact(url: str) -> str:
    """The URL with its password (and ACL user's password) replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, ""))


def connect(url: str, *, timeout_s: float = 10.0, ping: bool = True,
            retries: int = 25) -> redis.Redis:
    """A client that retries through a Redis restart (about 30 s of backoff) instead of
    failing the run on the first refused connection. With `ping`, a Redis that is not there
    at all is reported at once (a user mistake, not an outage to ride out). `retries=0` for a
    look that must not hold its caller through an outage (a progress hook's view)."""
    if ping:
        with redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3) as probe:
            probe.ping()
    retry = Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=retries)
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        socket_keepalive=True,
        socket_keepalive_options=keepalive_options(),
        health_check_interval=15,
        retry=retry,
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
    )


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_hash(client: redis.Redis, key: str) -> dict[str, str]:
    """HGETALL as str -> str (fleetgen keeps only text in its hashes)."""
    return {text(k): text(v) for k, v in client.hgetall(key).items()}
