"""Redis connections that survive a server restart, and URLs that never leak a password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from fleetgen.base.envvars import REDIS_URL
from fleetgen.base.errors import ConfigError


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


def connect(url: str, *, timeout_s: float = 10.0, ping: bool = True) -> redis.Redis:
    """A client that retries through a Redis restart (about 30 s of backoff) instead of
    failing the run on the first refused connection. With `ping`, a Redis that is not there
    at all is reported at once (a user mistake, not an outage to ride out)."""
    if ping:
        with redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3) as probe:
            probe.ping()
    retry = Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=25)
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        socket_keepalive=True,
        health_check_interval=15,
        retry=retry,
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
    )


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_hash(client: redis.Redis, key: str) -> dict[str, str]:
    """HGETALL as str -> str (fleetgen keeps only text in its hashes)."""
    return {text(k): text(v) for k, v in client.hgetall(key).items()}
