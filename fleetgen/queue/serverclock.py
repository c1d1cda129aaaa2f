"""Valkey's clock: the one clock every lease and heartbeat is written and read on, so no host's
clock (NTP off on one node of a hundred) decides when another host's prompt is given away."""

from __future__ import annotations

import time

import redis

# The Lua lines that put Valkey's TIME in `now`, as the decimal text ZADD and HSET take
# (`TIME` is seconds and microseconds; a Lua number would print only 14 digits). A script may
# call TIME before writing: Valkey replicates a script's effects, not the script.
LUA_NOW = """
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
"""


def server_time(client: redis.Redis) -> float:
    """Valkey's clock now (epoch s), one round trip."""
    seconds, micros = client.time()
    return seconds + micros / 1e6


class ServerClock:
    """Valkey's clock read through this host's: the offset between the two is measured once
    every `refresh_s` (one TIME), so a reader that compares many heartbeats (the producer's
    affinity, metrics) pays a round trip a refresh, not one a look. A jump of this host's
    clock is wrong for at most `refresh_s`."""

    def __init__(self, client: redis.Redis, refresh_s: float = 10.0) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self._offset_s = 0.0
        self._measured_at: float | None = None

    def now(self) -> float:
        mono = time.monotonic()
        if self._measured_at is None or mono - self._measured_at >= self.refresh_s:
            before = time.time()
            server = server_time(self.client)
            # The reply was made half a round trip, give or take, after the request left.
            self._offset_s = server - (before + time.time()) / 2
            self._measured_at = mono
        return time.time() + self._offset_s
