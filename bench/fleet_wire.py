"""The fleet_scale bench's wire-level worker: what one worker sends Valkey on each of its paths,
command for command and round trip for round trip, on its own connection, for a fraction of
the CPU of kombu and redis-py, so that a thousand of them share one core on one event loop.

Profiled (cProfile, one process of 250 kombu workers on a quiet machine): a row's five round
trips through kombu and redis-py cost ~1.5 ms of client CPU and a beat ~1 ms, a core for 250
workers: 1,000 of them needed four of these two cores, and on a loaded machine made half their
beats and no rows. The Valkey traffic is what matters here, and it is made by these paths:

- take (kombu's `basic_get`: `Channel._get`, then fleetgen's `QoS.append`): RPOP of the
  queue (and of its priority lists while it is empty), then the append script (EVALSHA).
- row: the worker's `generate_one` with the real `StreamSink` (its is_done pipeline of GETBIT +
  EXISTS, then the outcome's script), the record built by the real code and only the sending
  done here; then the ack (fleetgen's `QoS.ack`: one script that removes the message only if
  this holder still holds it).
- beat (workers/gate.py `_heartbeat`, fleetgen's `QoS.beat`): one script that renews the lease
  and writes the heartbeat hash (HSET, EXPIRE) and reads the closing key, with the real
  `heartbeat.lease_fields`.
- sweep (`QoS.restore_visible`): the due script (is this the fleet's sweep of the period?
  with Valkey's TIME); if it is, the lock's SET NX PX (redis-py's `Lock`, as kombu's `Mutex`),
  the ZRANGEBYSCORE of lapsed leases and of old-scored tags, the lock's release script; a
  lapsed holder is restored by the real `QoS` code.

tests/bench/test_fleet_wire.py checks each path's commands against the real code's, counted by
Valkey. What differs from a real worker: one connection where kombu keeps two or three (its
BRPOP client and a pool), RESP2 (no HELLO 3), and a take by RPOP (basic_get) where Celery's
consumer sends the take script (`broker._TAKE`: an LMOVE into the holder's taking list) that
returns at once while the queue holds messages; the append then pops it off that list.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from redis.lock import Lock

from fleetgen.queue import heartbeat
from fleetgen.queue.broker import (
    _ACK,
    _APPEND,
    _BEAT,
    _SWEEP_DUE,
    _SWEPT,
    SWEEP_DUE_SHARE,
    _seconds,
)
from fleetgen.queue.celeryconf import sweep_interval_s
from fleetgen.queue.contract import QUEUE, closing_key, worker_key
from fleetgen.queue.wire import (
    IN_FLIGHT,
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    LEASES,
    SWEEP_DUE,
    held_key,
    in_flight_entry,
    taking_key,
    task_payload,
)
from fleetgen.runstate.keys import RunKeys
from workers.sink import _EMIT_IF_RUN_EXISTS, StreamSink

# kombu's defaults for the names and the lock (transport/redis.py: priority_steps, sep,
# unacked_mutex_key/expire); the release is redis-py's Lock's script.
PRIORITY_QUEUES = [QUEUE, *(f"{QUEUE}\x06\x16{p}" for p in (3, 6, 9))]
MUTEX_KEY = "unacked_mutex"
MUTEX_EXPIRE_MS = 300_000


def sha(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


SCRIPTS = {name: (sha(source), source) for name, source in
           {"append": _APPEND, "ack": _ACK, "beat": _BEAT, "swept": _SWEPT, "due": _SWEEP_DUE,
            "emit": _EMIT_IF_RUN_EXISTS, "release": Lock.LUA_RELEASE_SCRIPT}.items()}


class ReplyError(Exception):
    pass


def _word(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else repr(value)).encode()


def pack(command: Iterable[Any]) -> bytes:
    words = [_word(w) for w in command]
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


class Wire:
    """One connection, RESP2: a call sends its commands in one write and reads their replies
    (a pipeline, as redis-py's, when there are several)."""

    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Wire:
        return cls(*await asyncio.open_connection(host, port))

    async def call(self, *commands: Iterable[Any]) -> list[Any]:
        self.writer.write(b"".join(pack(c) for c in commands))
        if len(commands) > 16:
            await self.writer.drain()
        replies = [await self._reply() for _ in commands]
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise reply
        return replies

    async def one(self, *command: Any) -> Any:
        return (await self.call(command))[0]

    async def _reply(self) -> Any:
        line = await self.reader.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else (await self.reader.readexactly(size + 2))[:-2]
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [await self._reply() for _ in range(size)]
        if kind == b":":
            return int(rest)
        if kind == b"+":
            return rest
        if kind == b"-":
            return ReplyError(rest.decode())
        raise ConnectionError(f"unexpected reply {line[:40]!r}")

    def close(self) -> None:
        self.writer.close()


class _Recorder:
    """Stands in for StreamSink's client: the outcome script's keys and args are kept, for
    the wire worker to send."""

    def __init__(self) -> None:
        self.sent: tuple[list[Any], list[Any]] | None = None

    def register_script(self, source: str) -> Any:
        def run(keys: list[Any], args: list[Any]) -> int:
            self.sent = (keys, args)
            return 1
        return run


class _Sink(StreamSink):
    """The real StreamSink's outcome, built and kept (`recorder.sent`); its is_done answer is
    the one the wire worker read."""

    done = False

    def __init__(self, worker: str) -> None:
        self.recorder = _Recorder()
        super().__init__(self.recorder, worker=worker)  # type: ignore[arg-type]

    def is_done(self, run: str, line: int) -> bool:
        return self.done


class WireWorker:
    """One emulated worker: its connection, its holder (one lease) and the tags it holds."""

    __slots__ = ("held", "held_key", "holder", "name", "sink", "wire")

    def __init__(self, name: str, wire: Wire) -> None:
        self.name, self.wire = name, wire
        self.holder = uuid.uuid4().hex
        self.held_key = held_key(self.holder)
        self.held: dict[bytes, int] = {}  # tag -> line (the payload is rebuilt from it)
        self.sink = _Sink(name)

    def _append(self, raw: bytes) -> tuple[tuple[Any, ...], int, bytes]:
        """The append script's call for a popped message (fleetgen's `QoS.append`)."""
        message = orjson.loads(raw)
        props = message["properties"]
        delivery = props["delivery_info"]
        tag = props["delivery_tag"].encode()
        copy = orjson.dumps([message, delivery["exchange"], delivery["routing_key"]])
        body = orjson.loads(base64.b64decode(message["body"]))
        payload = task_payload(message)
        assert payload is not None
        command = ("EVALSHA", SCRIPTS["append"][0], 6, KOMBU_UNACKED_INDEX, KOMBU_UNACKED,
                   self.held_key, LEASES, IN_FLIGHT, taking_key(self.holder), tag, copy,
                   self.holder, in_flight_entry(body) or "", "")
        return command, int(payload["line"]), tag

    async def take(self) -> bytes | None:
        """kombu's basic_get: RPOP of each priority list until one gives a message."""
        for queue in PRIORITY_QUEUES:
            raw = await self.wire.one("RPOP", queue)
            if raw is not None:
                command, line, tag = self._append(raw)
                await self.wire.one(*command)
                self.held[tag] = line
                return tag
        return None

    async def fill(self, count: int) -> list[bytes]:
        """Up to `count` takes in two round trips (RPOPs, then appends): the fill is not
        measured."""
        raws = await self.wire.call(*[("RPOP", QUEUE)] * count)
        appends = [self._append(raw) for raw in raws if raw is not None]
        if appends:
            await self.wire.call(*(command for command, _, _ in appends))
        for _, line, tag in appends:
            self.held[tag] = line
        return [tag for _, _, tag in appends]

    async def answer(self, tag: bytes, payload: dict[str, Any], engine: Any) -> str:
        """The row: is_done's pipeline, the real `generate_one` (outcome built, not sent), the
        outcome's script, the ack."""
        from fleetgen.engine.decision import RetryPolicy
        from workers.generate import generate_one

        keys = RunKeys(payload["run"])
        done, _known = await self.wire.call(("GETBIT", keys.done, payload["line"]),
                                            ("EXISTS", keys.manifest))
        self.sink.done, self.sink.recorder.sent = bool(done), None
        kind = generate_one(payload, engine, self.sink, RetryPolicy(),  # type: ignore[arg-type]
                            worker=self.name)
        if self.sink.recorder.sent is not None:
            script_keys, args = self.sink.recorder.sent
            await self.wire.one("EVALSHA", SCRIPTS["emit"][0], len(script_keys), *script_keys,
                                *args)
        await self.wire.one("EVALSHA", SCRIPTS["ack"][0], 4, KOMBU_UNACKED_INDEX, KOMBU_UNACKED,
                            self.held_key, IN_FLIGHT, tag)
        self.held.pop(tag, None)
        return kind

    async def beat(self, fields: dict[str, Any], interval_s: float, lease_s: float,
                   sweep_s: float) -> None:
        """The gate's beat: `QoS.beat`'s script, the lease and the heartbeat hash."""
        beat = {**fields, "inflight": len(self.held),
                **heartbeat.lease_fields(interval_s=interval_s, lease_s=lease_s, sweep_s=sweep_s,
                                         held=len(self.held))}
        key = worker_key(self.name)
        await self.wire.one("EVALSHA", SCRIPTS["beat"][0], 3, LEASES, key, closing_key(),
                            self.holder, repr(time.time()),
                            heartbeat.ttl_s(interval_s, lease_s, sweep_s),
                            *(w for kv in beat.items() for w in kv))

    async def sweep(self, lease_s: float,
                    restore: Callable[[list[bytes], float], Awaitable[None]]) -> None:
        """kombu's sweep under its lock; the lapsed holders it finds are restored by
        `restore` (the real code) before the lock is released."""
        period_ms = int(sweep_interval_s(lease_s) * 1000 * SWEEP_DUE_SHARE)
        now = await self.wire.one("EVALSHA", SCRIPTS["due"][0], 1, SWEEP_DUE, period_ms)
        if now is None:
            return
        cutoff = _seconds(now) - lease_s
        token = uuid.uuid1().hex
        if await self.wire.one("SET", MUTEX_KEY, token, "NX", "PX", MUTEX_EXPIRE_MS) is None:
            return
        lapsed: list[bytes] = await self.wire.one("ZRANGEBYSCORE", LEASES, "-inf", cutoff)
        if lapsed:
            await restore(lapsed, cutoff)
        await self.wire.one("ZRANGEBYSCORE", KOMBU_UNACKED_INDEX, 0, cutoff)
        await self.wire.one("EVALSHA", SCRIPTS["release"][0], 1, MUTEX_KEY, token)


async def load_scripts(wire: Wire) -> None:
    await wire.call(*(("SCRIPT", "LOAD", source) for _, source in SCRIPTS.values()))
