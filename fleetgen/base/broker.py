"""kombu's Redis transport, with one change: a channel's synchronous Redis client is made once.

kombu 5.7 (`kombu/transport/redis.py`) makes a new `redis.Redis` on every
`Channel.conn_or_acquire()` without a client: `QoS.append` (the unacked copy of every
delivered message) and `QoS.ack` (its removal) each call `Channel._create_client()`, and
`redis.Redis.__init__` builds its ~200-entry `CaseInsensitiveDict` of response callbacks each
time. Profiled in a worker at hundreds of prompts a second (py-spy --gil,
docs/performance.md), those constructions were 12 % of its CPU. A `redis.Redis` holds no
connection of its own (every command and pipeline borrows one from the pool), so one client per
channel and pool serves every thread; a new pool (kombu drops it after a fork or on close)
gets a new client.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

# What Celery's `broker_transport` names (fleetgen/base/celeryconf.py).
TRANSPORT = f"{__name__}:Transport"


class Channel(kombu_redis.Channel):
    _sync: tuple[Any, Any] | None = None  # (the pool it was made for, the client)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            # The BRPOP and publish clients: kombu keeps those itself (`Channel.client`).
            return super()._create_client(asynchronous=True)
        pool = self.pool
        made = self._sync
        if made is None or made[0] is not pool:
            # Two threads may both get here: each gets a working client, one is kept.
            made = self._sync = (pool, super()._create_client())
        return made[1]


class Transport(kombu_redis.Transport):
    Channel = Channel
