"""The one reading of the engine URLs a command is given (`run`, `doctor`, `produce`, `check`):
repeated flags, comma lists and port ranges alike, each URL checked before any connection."""

from __future__ import annotations

import re
from collections.abc import Iterable

import httpx

from fleetgen.errors import ConfigError

# http://host:30000-30007: eight servers on consecutive ports (an IPv6 host in brackets).
PORT_RANGE = re.compile(r"^(https?://(?:\[[^\]/]+\]|[^/:\[\]]+)):(\d+)-(\d+)(/.*)?$")
MAX_RANGE = 64  # servers in one range: more is a typo (one node, a worker per server)


def check_url(url: str, what: str = "--engine-url") -> str:
    """An engine URL as given, or a ConfigError naming what is wrong with it: without a scheme
    httpx fails before any connection, which would read as "the server is down"; a port that
    is not one would be httpx's InvalidURL traceback."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(f"{what} {url!r} has no scheme: give http://{url} (or https://)")
    if scheme not in ("http", "https") or not rest.strip("/"):
        raise ConfigError(f"{what} must be an http:// or https:// URL with a host, got {url!r}")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"{what} {url!r} is not a URL ({exc}); give http://HOST:PORT, "
                          f"http://HOST:FIRST-LAST for a range of ports, or a comma "
                          f"list") from None
    if not parsed.host:
        raise ConfigError(f"{what} must be an http:// or https:// URL with a host, got {url!r}")
    return url


def engine_urls(values: Iterable[str], what: str = "--engine-url") -> list[str]:
    """Every server named by `values` (the flag's values, each a URL, a comma list of them or
    a range of ports), in order; ConfigError, one line, for anything else or a server named
    twice (one worker each)."""
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            url = part.strip()
            if not url:
                raise ConfigError(f"{what} {value!r}: an empty item in the comma list")
            out += _expand(url, what)
    twice = sorted({u for u in out if out.count(u) > 1})
    if twice:
        raise ConfigError(f"{what}: {', '.join(twice)} named twice; one worker each")
    return out


def one_engine_url(value: str, what: str = "--engine-url") -> str:
    """For a command that probes one server (`fleetgen check`): the same forms, one server."""
    urls = engine_urls([value], what)
    if len(urls) != 1:
        raise ConfigError(f"{what} {value!r} names {len(urls)} servers; this command checks "
                          "one (run it once per server)")
    return urls[0]


def _expand(url: str, what: str) -> list[str]:
    found = PORT_RANGE.match(url)
    if found is None:
        return [check_url(url, what)]
    host, path = found.group(1), found.group(4) or ""
    first, last = int(found.group(2)), int(found.group(3))
    if not 0 < first <= last < 65536:
        raise ConfigError(f"{what} {url}: the port range {first}-{last} is empty")
    if last - first >= MAX_RANGE:
        raise ConfigError(f"{what} {url}: {last - first + 1} servers, one worker each on "
                          f"this node; a range names at most {MAX_RANGE}")
    return [check_url(f"{host}:{port}{path}", what) for port in range(first, last + 1)]
