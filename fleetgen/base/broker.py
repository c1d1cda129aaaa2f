"""kombu's Redis transport and JSON codec, with what a worker pays per message made cheaper.

Profiled in a worker at hundreds of prompts a second (py-spy --gil, docs/performance.md):

- kombu 5.7 (`kombu/transport/redis.py`) makes a new `redis.Redis` on every
  `Channel.conn_or_acquire()` without a client: `QoS.append` (the unacked copy of every
  delivered message) and `QoS.ack` (its removal) each call `Channel._create_client()`, and
  `redis.Redis.__init__` builds its ~200-entry `CaseInsensitiveDict` of response callbacks each
  time: 12 % of the worker's CPU. A `redis.Redis` holds no connection of its own (every
  command and pipeline borrows one from the pool), so one client per channel and pool serves
  every thread; a new pool (kombu drops it after a fork or on close) gets a new client.
- The task body (the prompt's token ids) is decoded by the stdlib's `json` with kombu's
  `object_hook` on every dict, in the consumer's one thread (Celery's `task_message_handler`
  asks `'args' not in message.payload` of every message, `celery/worker/strategy.py`): 6 %.
  `use_orjson_decoder` keeps the content type and kombu's encoder and decodes with orjson
  whatever carries none of kombu's typed values.
- `QoS.append` re-encodes the whole message (body included) with the stdlib for the unacked
  copy: 3 %. The QoS below encodes it with orjson; kombu reads it back as any JSON.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from kombu import serialization
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.transport.redis import Mutex, MutexHeld
from kombu.utils import json as kombu_json
from kombu.utils.scheduling import priority_cycle

from fleetgen.base.contract import AFFINITY_PREFIX
from fleetgen.base.serverclock import LUA_NOW, server_time

# What Celery's `broker_transport` names (fleetgen/base/celeryconf.py).
TRANSPORT = f"{__name__}:Transport"

JSON = "application/json"
# kombu's JSON writes a value the stdlib cannot (a datetime, a UUID, bytes…) as an object
# {"__type__": …, "__value__": …} that its `object_hook` turns back (`kombu/utils/json.py`).
_TYPED = b'"__type__"'


def json_loads(data: bytes | str) -> Any:
    """kombu's JSON decoder, by orjson when the text holds no typed value of kombu's (and is
    JSON orjson reads: not NaN or Infinity, which the stdlib writes)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if _TYPED not in raw:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return kombu_json.loads(raw)


def use_orjson_decoder() -> None:
    """Decode application/json messages with `json_loads` in this process; encoding, content
    type and what Celery accepts stay kombu's."""
    serialization.registry.register("json", None, json_loads, content_type=JSON)


# The unacked copy and its lease, written together with the lease's time on Valkey's clock.
_APPEND = LUA_NOW + """
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return t
"""
# A renewal of every tag named that is still in the index (XX: an acked tag, or one a sweep
# already gave to another worker, stays out), to Valkey's now.
_RENEW = LUA_NOW + """
for i = 1, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now, ARGV[i]) end
return t
"""


def _seconds(reply: Any) -> float:
    """A script's `t` (TIME's [seconds, microseconds]) as epoch seconds."""
    return int(reply[0]) + int(reply[1]) / 1e6


class QoS(kombu_redis.QoS):
    """kombu's QoS with every lease on Valkey's clock. kombu scores the unacked index with the
    worker's `time()` and every worker's sweep compares it with its own `time()`
    (transport/redis.py `QoS.append`, `QoS.restore_visible`): a worker whose clock is 120 s
    ahead swept every live worker's prompts at a 60 s lease (385 requests for 238 prompts,
    issue 42), and one 120 s behind wrote leases that had lapsed when written. Here the lease
    is written by a script that reads TIME, and the sweep's cut-off is Valkey's TIME less the
    timeout: every host's clock is out of it."""

    renewed_at: float | None = None  # Valkey's time of the last renewal (the beat's `at`)
    clock_skew_s: float = 0.0  # this host's clock less Valkey's, as of the last renewal

    def _script(self, client: Any, source: str, keys: list[str], args: list[Any]) -> Any:
        scripts: dict[str, Any] = self.__dict__.setdefault("_scripts", {})
        if source not in scripts:
            scripts[source] = client.register_script(source)
        return scripts[source](keys=keys, args=args, client=client)

    def append(self, message: Any, delivery_tag: str) -> None:
        """kombu's `QoS.append` (ZADD of the tag's delivery time to the unacked index, HSET of
        `[message, exchange, routing key]` in the unacked hash, atomically; then the
        in-memory entry), with the time Valkey's and the copy encoded by orjson."""
        delivery = message.delivery_info
        copy = [message._raw, delivery["exchange"], delivery["routing_key"]]
        try:
            encoded: bytes | str = orjson.dumps(copy)
        except TypeError:  # a value orjson cannot write: kombu's encoder can
            encoded = kombu_json.dumps(copy)
        with self.channel.conn_or_acquire() as client:
            self._script(client, _APPEND, [self.unacked_index_key, self.unacked_key],
                         [delivery_tag, encoded])
        virtual.QoS.append(self, message, delivery_tag)

    def renew(self) -> int:
        """Renew the lease on every message this channel holds (delivered, not acked): its
        score in the unacked index, the delivery time the sweep (`restore_visible`) compares
        with the visibility timeout, becomes Valkey's now. Returns how many it holds, and
        keeps Valkey's time of the renewal in `renewed_at` (one round trip even when it holds
        nothing: the heartbeat's time is Valkey's too). Called from the worker's heartbeat
        (workers/gate.py): while the worker lives, nothing it holds is redelivered, however
        long a generation takes; once it is dead the leases lapse after the visibility
        timeout."""
        held = self._held()
        with self.channel.conn_or_acquire() as client:
            before = time.time()
            server = _seconds(self._script(client, _RENEW, [self.unacked_index_key], held))
            self.clock_skew_s = (before + time.time()) / 2 - server
        self.renewed_at = server
        return len(held)

    def restore_visible(self, start: int = 0, num: int | None = 10, interval: int = 10) -> None:
        """kombu's sweep of lapsed leases (the same throttle, lock, page and `restore_by_tag`
        transaction), with the cut-off on Valkey's clock instead of this host's."""
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        with self.channel.conn_or_acquire() as client:
            cutoff = server_time(client) - self.visibility_timeout
            try:
                with Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    lapsed = client.zrange(self.unacked_index_key, cutoff, 0, desc=True,
                                           byscore=True, offset=num and start, num=num)
                    for tag in lapsed or []:
                        self.restore_by_tag(tag, client)
            except MutexHeld:
                pass

    def _held(self) -> list[str]:
        """The tags delivered and not acked. The consumer thread adds and removes tags while
        the heartbeat's timer thread copies them, and a dict or set that changes size during
        the copy raises RuntimeError: copy again (the window is a few microseconds; the last
        try's error goes to the heartbeat, which skips that one beat)."""
        for attempt in range(8):
            try:
                acked = set(self._dirty)
                return [tag for tag in tuple(self._delivered) if tag not in acked]
            except RuntimeError:
                if attempt == 7:
                    raise
        return []


class OwnQueueFirst(priority_cycle):
    """The order a worker's BRPOP names its queues in: its own queue (the next turns of what it
    answered, producer/affinity.py) before the shared one, always. kombu's default,
    `round_robin_cycle`, moves the queue a message came from to the end of the list
    (`Channel._brpop_read` -> `_queue_cycle.rotate(dest)`), so a next turn waiting in the
    worker's own queue lost every other free slot to the shared queue, and the producer's
    short wait then sent it to another server whose cache does not hold its history.
    `priority_cycle` keeps the order; `update` (called on every consume and cancel,
    `Channel._update_queue_cycle`) puts the own queues first. BRPOP takes from the first key
    that holds a message (`Channel._brpop_start`), so the shared queue is served whenever the
    own queue is empty: it holds at most a pool's worth, all of them this worker's work."""

    def update(self, it: Any) -> None:
        queues = list(it)
        self.items[:] = [q for q in queues if q.startswith(AFFINITY_PREFIX)] + \
            [q for q in queues if not q.startswith(AFFINITY_PREFIX)]


class Channel(kombu_redis.Channel):
    QoS = QoS
    # `Channel.__init__` makes its cycle with `cycle_by_name(self.queue_order_strategy)`,
    # which takes a dotted path as well as kombu's aliases.
    queue_order_strategy = f"{__name__}:OwnQueueFirst"
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
