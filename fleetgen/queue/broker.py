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

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from functools import cached_property
from queue import Empty
from time import monotonic
from typing import Any

import orjson
from kombu import serialization
from kombu.asynchronous import get_event_loop
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.transport.redis import Mutex, MutexHeld
from kombu.utils import json as kombu_json
from kombu.utils.scheduling import priority_cycle

from fleetgen.queue.acks import ACKS, SETTLE_S
from fleetgen.queue.contract import AFFINITY_PREFIX, QUEUE
from fleetgen.queue.redisconn import text
from fleetgen.queue.serverclock import LUA_NOW
from fleetgen.queue.wire import (
    IN_FLIGHT,
    LEASES,
    SWEEP_DUE,
    held_key,
    in_flight_entry,
    routing_key,
    taking_key,
)

log = logging.getLogger("fleetgen.worker")

# What Celery's `broker_transport` names (fleetgen/queue/celeryconf.py).
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


# The unacked copy, in its holder's set, what it is in `wire.IN_FLIGHT` (ARGV[4], '' for a
# message not fleetgen's task), and the holder's lease renewed, in one step. The
# index gets the score +inf: a message is swept by its holder's lease (`_SWEEP`), never by its
# delivery time, and kombu's own time-based sweep (an older worker's) never takes it.
#
# A message taken by `_TAKE` or the BLMOVE (`Channel._take_start`) is the tail of the holder's
# taking list (KEYS[6]) until this script records it: ARGV[5] is the SHA1 of the raw message
# taken, and the script pops it off the list in the same step. If the tail is another (the
# sweep handed what this holder took back to the queue while it was cut off past its lease),
# nothing is recorded and false is returned: the message is someone else's now.
_APPEND = LUA_NOW + """
if ARGV[5] and ARGV[5] ~= '' then
  local taken = redis.call('LINDEX', KEYS[6], -1)
  if not taken or redis.sha1hex(taken) ~= ARGV[5] then return false end
  redis.call('RPOP', KEYS[6])
end
redis.call('ZADD', KEYS[1], 'inf', ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[4], now, ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[5], ARGV[1], ARGV[4]) end
return t
"""
# The take (issue 52, point 1). kombu's BRPOP removes a message from the queue before its
# holder records it (`QoS.append`, a second round trip): a reply lost in a cut network, or a
# worker killed between the two, lost the message for good (only a waiting producer's
# reconciliation brought its row back). Here a message moves, in the same step that takes it,
# into the holder's taking list (`wire.taking_key`), where it stays until `_APPEND` records it:
# whatever happens between, it is in Valkey under the holder's name, and the sweep hands a
# lapsed holder's taking list back to the queue as it hands back what it held. KEYS[1]: the
# taking list; KEYS[2]: the leases (the holder gets one if it has none, so an orphaned taking
# list is swept even for a worker that died before its first beat); KEYS[3..]: the queues in
# the order the worker serves them. A message left in the taking list by a take whose reply
# never arrived (or whose record failed) is returned first, to this same holder, with '' for
# its queue (its routing key says which). Returns {queue, raw message} or false.
_TAKE = LUA_NOW + """
redis.call('ZADD', KEYS[2], 'NX', now, ARGV[1])
local left = redis.call('LINDEX', KEYS[1], -1)
if left then return {'', left} end
for i = 3, #KEYS do
  local item = redis.call('LMOVE', KEYS[i], KEYS[1], 'RIGHT', 'LEFT')
  if item then return {KEYS[i], item} end
end
return false
"""
# The beat: the holder's lease renewed (one member, however many prompts it holds) and the
# worker's heartbeat hash (KEYS[2]) in one step, so a
# thousand workers cost Valkey one round trip a beat, not two (docs/scale.md). The hash's `at`
# is the renewal's time; `skew_s` the worker's clock when it sent the call (ARGV[2]) less
# Valkey's, shown to the operator and used by nothing; ARGV[3] its TTL, ARGV[4..] the other
# fields. Returns the closing key (KEYS[3], fleetgen/queue/closing.py).
_BEAT = LUA_NOW + """
redis.call('ZADD', KEYS[1], now, ARGV[1])
local skew = tonumber(ARGV[2]) - (tonumber(t[1]) + tonumber(t[2]) / 1000000)
redis.call('HSET', KEYS[2], 'at', now, 'skew_s', string.format('%.3f', skew), unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], ARGV[3])
return redis.call('GET', KEYS[3])
"""
# Whether this worker's sweep is the fleet's for this period (KEYS[1] was unset: it is set for
# ARGV[1] ms); if so, Valkey's TIME for the cutoff, in the same round trip.
_SWEEP_DUE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return redis.call('TIME') end
return false
"""
# A period's share the due key lasts: a lone worker, whose timer fires a little early or late,
# still sweeps every period.
SWEEP_DUE_SHARE = 0.9
# After a sweep restored the tags of holder ARGV[1] (each restore took its tag out of the
# holder's set, `QoS._restore_held`): the holder leaves the leases if its lease is still the
# lapsed one (a frozen worker that woke meanwhile keeps its lease and what it took since).
_SWEPT = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then redis.call('ZREM', KEYS[1], ARGV[1]) end
return 1
"""
# An ack (or a reject without requeue) of tag ARGV[1] by the holder whose set is KEYS[3]: the
# unacked copy (KEYS[2]), its index entry (KEYS[1]) and its in-flight entry (KEYS[4]) go only if
# this holder still holds the tag. A holder cut off from Valkey past its lease acks late, after
# the heal; by then the sweep has handed the prompt back and another worker may hold it under
# the same tag (kombu's restore keeps it): that worker's copy must stay (issue 52). Returns 1 if
# removed, 0 if the tag was no longer this holder's.
_ACK = """
if redis.call('SREM', KEYS[3], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return 1
"""


def _seconds(reply: Any) -> float:
    """A script's `t` (TIME's [seconds, microseconds]) as epoch seconds."""
    return int(reply[0]) + int(reply[1]) / 1e6


class QoS(kombu_redis.QoS):
    """kombu's QoS with a lease per channel, on Valkey's clock.

    kombu scores each unacked message with the worker's `time()` and every worker's sweep
    compares it with its own `time()` (transport/redis.py `QoS.append`, `restore_visible`): a
    worker whose clock was 120 s ahead swept every live worker's prompts at a 60 s lease (385
    requests for 238 prompts, issue 42), one 120 s behind wrote leases that had lapsed when
    written. And a renewal of every message held was a ZADD each: at 1,000 workers holding 129
    each, 64,500 ZADDs a second before any row is made. Here each channel is one holder
    (`holder`, unique per channel) with one lease in `wire.LEASES`, renewed by one ZADD at each
    beat, and a set of the tags it holds (`wire.held_key`), changed only when it takes or acks
    one; the sweep restores the tags of holders whose lease lapsed. Every time is Valkey's
    TIME, read inside the scripts: no host's clock is in it."""

    @cached_property
    def holder(self) -> str:
        return uuid.uuid4().hex

    @cached_property
    def held_key(self) -> str:
        return held_key(self.holder)

    @cached_property
    def taking_key(self) -> str:
        return taking_key(self.holder)

    def _script(self, client: Any, source: str, keys: list[str], args: list[Any]) -> Any:
        scripts: dict[str, Any] = self.__dict__.setdefault("_scripts", {})
        if source not in scripts:
            scripts[source] = client.register_script(source)
        return scripts[source](keys=keys, args=args, client=client)

    @cached_property
    def recording(self) -> set[str]:  # tags whose record waits on the acks thread
        return set()

    def append(self, message: Any, delivery_tag: str, pipe: Any = None) -> None:
        """kombu's `QoS.append` (the tag in the unacked index, `[message, exchange, routing
        key]` in the unacked hash, atomically; then the in-memory entry), with the tag in this
        holder's set, its lease renewed, and the copy encoded by orjson. With `pipe`, the
        script is queued there for the caller to execute (bench/fleet_scale.py's fill). On
        Celery's consumer loop, the record of a take goes to the acks thread (issue 52: the
        loop never waits on Valkey; `_record_off_loop` says why that is safe).
        """
        delivery = message.delivery_info
        copy = [message._raw, delivery["exchange"], delivery["routing_key"]]
        try:
            encoded: bytes | str = orjson.dumps(copy)
        except TypeError:  # a value orjson cannot write: kombu's encoder can
            encoded = kombu_json.dumps(copy)
        # `message.payload` is kombu's decode of the body, cached on the message: Celery's
        # strategy reads the same cache next (`'args' not in message.payload`), so the
        # prompt's token ids are parsed once per take, not twice (~110 µs for 3,000 ids).
        try:
            entry = in_flight_entry(message.payload) if message.content_type == JSON else None
        except Exception:  # a body kombu cannot decode: Celery rejects it its own way next
            entry = None
        keys = [self.unacked_index_key, self.unacked_key, self.held_key, LEASES, IN_FLIGHT,
                self.taking_key]
        taken, self.channel.taken_sha1 = getattr(self.channel, "taken_sha1", ""), ""
        args = [delivery_tag, encoded, self.holder, entry or "", taken]
        hub = get_event_loop()
        if pipe is not None:
            self._script(pipe, _APPEND, keys, args)
        elif taken and hub is not None and not getattr(self.channel, "taken_late", False):
            _record_off_loop(self, keys, args, hub)
        else:
            _record_here(self, keys, args)
        virtual.QoS.append(self, message, delivery_tag)

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        """kombu's removal (ZREM + HDEL), and the tag out of this holder's set and of the
        in-flight index. Unguarded: an ack or a restore goes through `_drop` or
        `_restore_held`, which remove only what this holder still holds."""
        return super()._remove_from_indices(delivery_tag, pipe) \
            .srem(self.held_key, delivery_tag).hdel(IN_FLIGHT, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        """Called on Celery's consumer loop (fleetgen/queue/acks.py says how): the tag leaves
        what this channel holds in memory at once (the slot is free for the next take), and
        its removal from Valkey (`_drop`) runs on the acks thread, never on the loop."""
        ACKS.submit(lambda: self._drop(delivery_tag), f"ack of message {delivery_tag}")
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """As `ack`: the hand-back to the queue (requeue) or the removal, on the acks thread."""
        if requeue:
            ACKS.submit(lambda: self.restore_by_tag(delivery_tag, leftmost=True),
                        f"hand-back of message {delivery_tag}")
        else:
            ACKS.submit(lambda: self._drop(delivery_tag), f"reject of message {delivery_tag}")
        virtual.QoS.ack(self, delivery_tag)

    def restore_unacked(self, client: Any = None) -> Any:
        """kombu's hand-back of every message still held (a channel closing, the SIGTERM
        hand-back of workers/handback.py), once the acks given before have reached Valkey:
        an acked tag is still in `_delivered` until kombu's `_flush`, and restored before its
        ack landed it would run twice."""
        if not ACKS.settle(SETTLE_S):
            log.warning("%d ack(s) still waiting on Valkey at the hand-back", ACKS.pending())
        self._flush()
        return super().restore_unacked(client)

    def _drop(self, delivery_tag: str) -> None:
        """The ack in Valkey (`_ACK`): nothing is removed unless this holder still holds it."""
        keys = [self.unacked_index_key, self.unacked_key, self.held_key, IN_FLIGHT]
        with self.channel.conn_or_acquire() as client:
            removed = self._script(client, _ACK, keys, [delivery_tag])
        if not removed:
            log.warning("late ack of message %s left alone: its lease lapsed and the sweep "
                        "handed it back (another worker may hold it now)", delivery_tag)

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        """kombu's restore of one message to its queue (a reject with requeue, the hand-back
        at shutdown, `restore_unacked`), only while this holder still holds it: a late
        hand-back must not requeue a second copy of what another worker holds."""
        self._restore_held(tag, self.held_key, client, leftmost)

    def _restore_held(self, tag: Any, held: str | None, client: Any = None,
                      leftmost: bool = False) -> None:
        """kombu's `restore_by_tag` (a WATCH transaction on the unacked hash: the copy back to
        its queue and out of the indices), and out of holder set `held`, done only if `held`
        still holds the tag (None: a tag of a worker without a holder, kombu's own QoS)."""
        tag = text(tag)

        def restore_transaction(pipe: Any) -> None:
            holds = held is None or pipe.sismember(held, tag)
            copy = pipe.hget(self.unacked_key, tag)
            pipe.multi()
            if not holds:
                return
            pipe.zrem(self.unacked_index_key, tag).hdel(self.unacked_key, tag) \
                .hdel(IN_FLIGHT, tag)
            if held is not None:
                pipe.srem(held, tag)
            if copy:
                message, exchange, routing_key = kombu_json.loads(text(copy))
                self.channel._do_restore_message(message, exchange, routing_key, pipe, leftmost)

        watched = [self.unacked_key] if held is None else [self.unacked_key, held]
        with self.channel.conn_or_acquire(client) as client:
            client.transaction(restore_transaction, *watched)

    def beat(self, key: str, fields: Mapping[str, Any], ttl_s: int, closing: str) -> Any:
        """Renew this channel's lease on every message it holds (one ZADD of its holder to
        Valkey's now) and write the worker's heartbeat hash `key`
        (`fields`, then `at` and `skew_s` from Valkey's clock, expiring after `ttl_s`), in one
        script; returns the value of the `closing` key. Called from the worker's heartbeat
        (workers/gate.py): while the worker lives, nothing it holds is redelivered, however
        long a generation takes; once it is dead its lease lapses after the visibility timeout
        and the next sweep hands its prompts to others. `fields` should say `held()`."""
        words = [word for item in fields.items() for word in item]
        with self.channel.conn_or_acquire() as client:
            args = [self.holder, repr(time.time()), ttl_s, *words]
            return self._script(client, _BEAT, [LEASES, key, closing], args)

    def held(self) -> int:
        """How many messages this channel holds (delivered, not acked)."""
        return len(self._held())

    def restore_visible(self, start: int = 0, num: int | None = 10, interval: int = 10) -> None:
        """The sweep (kombu's throttle and lock, its `restore_by_tag` transaction for each
        message), when it is the fleet's for this period (`_SWEEP_DUE`): the tags of every
        holder whose lease lapsed on Valkey's clock, and any tag an older worker scored with
        its delivery time that is older than the timeout."""
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        with self.channel.conn_or_acquire() as client:
            # Each worker's timer fires every period, and every sweep covers every holder: at
            # 1,000 workers that was a sweep every 6 ms and ~730 round trips a second (TIME,
            # the lock, two ZRANGEBYSCOREs, the release) for nothing. One a period is what the
            # bound needs (lease + one period, docs/design.md "Leases").
            period_ms = int(self.channel.unacked_restore_interval * 1000 * SWEEP_DUE_SHARE)
            now = self._script(client, _SWEEP_DUE, [SWEEP_DUE], [max(period_ms, 1)])
            if not now:
                return
            cutoff = _seconds(now) - self.visibility_timeout
            try:
                with Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    for holder in client.zrangebyscore(LEASES, "-inf", cutoff):
                        self._restore_holder(client, text(holder), cutoff)
                    for tag in client.zrangebyscore(self.unacked_index_key, 0, cutoff,
                                                    start=start if num else None, num=num):
                        self._restore_held(tag, None, client)
            except MutexHeld:
                pass

    def _restore_holder(self, client: Any, holder: str, cutoff: float) -> None:
        held = held_key(holder)
        for tag in client.smembers(held):
            self._restore_held(tag, held, client)
        _untake(client, taking_key(holder))
        self._script(client, _SWEPT, [LEASES], [holder, cutoff])

    def _held(self) -> list[str]:
        """The tags delivered and not acked."""
        return _unacked(self._delivered, self._dirty)


def _untake(client: Any, taking: str) -> None:
    """What a lapsed holder took and never recorded back at the right end of its queue (the
    next taken there), oldest first. Each move is one LMOVE: a holder that records the same
    message meanwhile finds it gone and drops it (`_APPEND`)."""
    while (item := client.lindex(taking, -1)) is not None:
        client.lmove(taking, routing_key(item) or QUEUE, "RIGHT", "RIGHT")


# The SHA1s of messages delivered whose record failed on the acks thread (Valkey gone past the
# client's retries): still in the taking list, so the next take gives them again, recorded
# then; the copy running already is the one that counts.
_UNRECORDED: set[str] = set()


def _record_off_loop(qos: QoS, keys: list[str], args: list[Any], hub: Any) -> None:
    """`_APPEND` (the record of a take) on the acks thread (fleetgen/queue/acks.py), the message
    delivered at once. kombu calls `QoS.append` on Celery's consumer loop, in its delivery
    callback (`virtual.Channel.basic_consume` `_callback`: `self.qos.append(message,
    message.delivery_tag)` then `callback(message)`), once per take: a synchronous round trip
    there held the loop for a slow or cut Valkey (issue 52). Safe because the take has already
    put the message in this holder's taking list, in Valkey: a worker killed before the record
    lands leaves it there, swept back once its lease lapses, and the sweep hands back a taking
    list only then (`restore_visible`: holders whose lease is older than the timeout), never
    while the worker beats. The acks thread is FIFO, so the record lands before the tag's ack
    or reject; a hand-back (`QoS.restore_unacked`) and a closing channel settle it first.

    Until it lands the channel sends no take (`Channel._brpop_start`): `_TAKE` gives first what
    the taking list holds unrecorded, and would give this message a second time; records
    then pop the list's tail in take order. Once it has landed (or failed) the loop is woken
    for its next take (kombu's `Hub.call_soon` wakes a loop waiting in its poller, from any
    thread); before, the loop itself waited for the record, so takes are not slower.

    Recorded on the loop instead (`_record_here`), before the delivery: with no event loop (a
    kombu consumer draining by hand: bench, tests), and for a message given again after a lost
    take reply or answered late (`Channel.taken_late`: after a cut, when the sweep may have
    handed it back meanwhile, so that it is dropped rather than run twice). Rare: once per
    lost or late reply, on a link that has just answered."""
    tag, taken = args[0], args[4]
    qos.recording.add(tag)

    def record() -> None:
        try:
            with qos.channel.conn_or_acquire() as client:
                recorded = qos._script(client, _APPEND, keys, args)
        except Exception:
            _UNRECORDED.add(taken)
            raise
        finally:
            qos.recording.discard(tag)
            hub.call_soon(_wake)
        if recorded is None:
            log.warning("message %s was handed back by the sweep before its record landed "
                        "(this worker's lease lapsed): it runs here and may run elsewhere; "
                        "the first outcome stands, this worker's ack is left alone", tag)

    ACKS.submit(record, f"record of message {tag}")


def _record_here(qos: QoS, keys: list[str], args: list[Any]) -> None:
    """`_APPEND` on the calling thread; the delivery dropped (kombu's loop drops a delivery
    whose callback raises Empty, kombu/asynchronous/hub.py) if the sweep handed the message
    back meanwhile, or if it runs here already (its record failed, `_UNRECORDED`)."""
    tag, taken = args[0], args[4]
    with qos.channel.conn_or_acquire() as client:
        recorded = qos._script(client, _APPEND, keys, args)
    if taken and recorded is None:
        log.warning("message %s taken before a cut was handed back by the sweep meanwhile "
                    "(this worker's lease lapsed): not run here", tag)
        raise Empty()
    if taken in _UNRECORDED:
        _UNRECORDED.discard(taken)
        raise Empty()


def _wake() -> None:
    """Nothing: the loop's next turn sends the take (kombu's `on_poll_start`)."""


def _unacked(delivered: Any, dirty: Any) -> list[str]:
    """The delivered tags not acked. The consumer thread adds and removes tags while the
    heartbeat's timer thread copies them, and a dict or set that changes size during the copy
    raises RuntimeError: copy again (the window is a few microseconds; the last try's error
    goes to the heartbeat, which skips that one beat)."""
    for attempt in range(8):
        try:
            acked = set(dirty)
            return [tag for tag in tuple(delivered) if tag not in acked]
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


def _task_queue(name: str) -> bool:
    """The shared queue or a worker's own (fleetgen/queue/contract.py)."""
    return name == QUEUE or name.startswith(AFFINITY_PREFIX)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, its take made reliable (`_TAKE`): the async BRPOP connection
    sends the take script, and only when it finds every queue empty, a BLMOVE of the last
    queue (the shared one) into the taking list, blocking for `brpop_timeout` (1 s). A
    message in the worker's own queue that arrives while it blocks on the shared one waits
    for that second at most. kombu's BRPOP stays for a channel with a global key prefix."""

    QoS = QoS
    _take_phase: str | None = None  # 'take' or 'block' while its reply is pending
    _block_next = False  # the last take found nothing: block on the shared queue next
    _blocked_on = ""
    taken_sha1 = ""  # of the message being delivered from a take, for `QoS.append`
    taken_late = False  # given again after a lost reply, or answered late: recorded first
    _refused_until = 0.0  # a take Valkey refused (OOM, MISCONF): the next waits a second

    def _brpop_start(self, timeout: Any = None) -> None:
        if self.global_keyprefix or not all(map(_task_queue, self.active_queues)):
            # Only fleetgen's task queues are taken reliably: a control command's replies
            # (kombu's pidbox, consumed without acks) are never recorded by `QoS.append`, so
            # a taking list would give them again at every take.
            return super()._brpop_start(timeout)
        qos: Any = self.qos
        if qos.recording:  # a record still waits on the acks thread (`_record_off_loop`)
            return None
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues or monotonic() < self._refused_until:
            return None
        keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        connection = self.client.connection
        self._in_poll = connection
        self._brpop_sent_at = monotonic()  # type: ignore[assignment]  # kombu's None default
        if self._block_next:
            self._take_phase, self._blocked_on = "block", queues[-1]
            connection.send_command("BLMOVE", self._q_for_pri(queues[-1], 0), qos.taking_key,
                                    "RIGHT", "LEFT", self.brpop_timeout if timeout is None
                                    else timeout)
        else:
            self._take_phase = "take"
            connection.send_command("EVAL", _TAKE, 2 + len(keys), qos.taking_key, LEASES,
                                    *keys, qos.holder)
        return None

    def _brpop_read(self, **options: Any) -> Any:
        phase = self._take_phase
        if phase is None:
            return super()._brpop_read(**options)
        try:
            try:
                reply = self.client.parse_response(self.client.connection,
                                                   "EVAL" if phase == "take" else "BLMOVE",
                                                   **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            except self.ResponseError as exc:  # the script writes: a full Valkey refuses it
                log.warning("Valkey refused a take (%s); trying again in a second", exc)
                self._refused_until = monotonic() + 1.0
                raise Empty() from exc
            self._block_next = phase == "take" and not reply
            if not reply:
                raise Empty()
            queue, item = (reply if phase == "take" else (self._blocked_on, reply))
            # A reply later than a blocking take's own timeout and a second: the network was
            # slow or cut, and the sweep may have handed the message back meanwhile.
            late = monotonic() - (self._brpop_sent_at or 0.0) > self.brpop_timeout + 1.0
            self._deliver_taken(text(queue).rsplit(self.sep, 1)[0], item, late)
            return True
        finally:
            self._take_phase = None
            self._in_poll = None  # type: ignore[assignment]  # as kombu's own _brpop_read
            self._flush_brpop_reauth()

    def _deliver_taken(self, queue: str, item: bytes, late: bool = False) -> None:
        """kombu's delivery of a BRPOP reply, the raw message's SHA1 left for `QoS.append`
        (a message taken into the taking list is recorded only if it is still there)."""
        self.taken_late = late or not queue
        if not queue:  # a message left from a take whose reply was lost: its own queue
            queue = routing_key(item) or ""
            if queue not in self.connection._callbacks:
                queue = self._queue_cycle.items[-1]
        self.taken_sha1 = hashlib.sha1(item).hexdigest()
        try:
            self.connection._deliver(kombu_json.loads(text(item)), queue)
        finally:
            self.taken_sha1, self.taken_late = "", False


    def close(self) -> None:
        """kombu's close, after the acks this process gave have reached Valkey (a worker's warm
        shutdown closes its channel next): kombu drops the pools first, and an ack left
        waiting would be lost with the process (its message swept back after the lease)."""
        if self._qos is not None and not ACKS.settle(SETTLE_S):
            log.warning("%d ack(s) still waiting on Valkey as the channel closes",
                        ACKS.pending())
        super().close()

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


class Sweeper:
    """The sweep (`QoS.restore_visible`, through kombu's `MultiChannelPoller
    .maybe_restore_messages`) on a daemon thread of its own, every sweep period, instead of on
    Celery's consumer loop: a sweep waits on Valkey (TIME, the lock, a WATCH transaction per
    message restored; on a cut link a 30 s socket timeout and retries), and a loop that waits
    on the network stops consuming, acking, and checking its BRPOP connection (issue 52). One
    a process; after a reconnection it sweeps through the new connection's poller.

    The same thread runs kombu's binding-expiry check (`_keep_bindings`) every second, as
    kombu's timer did on the loop."""

    def __init__(self) -> None:
        self._cycle: Any = None
        self._interval_s = 10.0
        self._thread: Any = None
        self._lock = threading.Lock()

    def follow(self, cycle: Any, interval_s: float) -> None:
        with self._lock:
            self._cycle, self._interval_s = cycle, max(float(interval_s), 0.1)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleetgen-sweep",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        swept_at = monotonic()
        while True:
            time.sleep(min(self._interval_s, BINDING_TICK_S))
            cycle = self._cycle
            _keep_bindings(cycle)
            if monotonic() - swept_at < self._interval_s:
                continue
            swept_at = monotonic()
            try:
                cycle.maybe_restore_messages()
            except Exception:  # a sweep must never end the thread; the next one retries
                log.debug("sweep failed", exc_info=True)


# kombu's timer for the binding expiry runs every second (`loop.call_repeatedly(1,
# cycle.maybe_refresh_binding_expiry)`); so does the sweep thread's check.
BINDING_TICK_S = 1.0


def _keep_bindings(cycle: Any) -> None:
    """kombu's `MultiChannelPoller.maybe_refresh_binding_expiry`, off the consumer loop (issue
    52). kombu 5.7 registers it with Celery's loop in `Transport.register_with_event_loop`:

        cycle._binding_expiry_tref = loop.call_repeatedly(
            1, cycle.maybe_refresh_binding_expiry
        )

    and each channel's `Channel.maybe_refresh_binding_expiry` does, for a channel consuming a
    queue that expires (here only Celery's remote-control channel: its pidbox queue has
    `control_queue_expires`, 10 s), a `REFRESH_BINDING` script per binding every third of the
    binding's TTL (at least 1 h: every 20 min), and `sweep_bindings` (a write script deleting
    other consumers' overdue binding tables) every `BINDING_SWEEP_INTERVAL` (60 s). Both are
    synchronous round trips: on the loop, a slow or cut Valkey held it once a minute for the
    client's socket timeout and retries. Here they wait on the sweep thread; late by a sweep
    at most, against a 1 h TTL. kombu's own errors are handled by kombu's function (a
    connection error or a refused script: tried again next second); anything else (a set
    of channels or bindings changed by the loop while this thread reads it) is tried again
    next second too, kombu keeping per channel when each was last done."""
    refresh = getattr(cycle, "maybe_refresh_binding_expiry", None)  # kombu 5.7 on
    if refresh is None:
        return
    try:
        refresh()
    except Exception:
        log.debug("binding expiry check failed", exc_info=True)


SWEEPER = Sweeper()


class Transport(kombu_redis.Transport):
    Channel = Channel

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """kombu's registration with Celery's loop, less its sweep timer and its binding-expiry
        timer: the `SWEEPER` thread runs both instead (`Sweeper`, `_keep_bindings`)."""
        super().register_with_event_loop(connection, loop)
        cycle: Any = self.cycle
        cycle._restore_messages_tref.cancel()
        binding_timer = getattr(cycle, "_binding_expiry_tref", None)  # kombu 5.7 on
        if binding_timer is not None:
            binding_timer.cancel()
        interval_s = connection.client.transport_options.get(
            "unacked_restore_interval", Channel.unacked_restore_interval)
        SWEEPER.follow(cycle, interval_s)
