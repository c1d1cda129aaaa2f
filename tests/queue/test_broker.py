"""fleetgen's kombu transport (fleetgen/queue/broker.py) against a real Valkey: the Celery app
uses it, a channel makes its synchronous client once per pool, and kombu's unacked copy and
ack still work through it; the unacked copy (orjson) is what kombu restores; the JSON
decoder reads plain JSON with orjson and kombu's typed values as kombu does. TLS (rediss://)
through it: tests/chaos/test_security.py."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import orjson
import pytest
import redis
from kombu import serialization
from kombu.utils import json as kombu_json

from fleetgen.queue import broker
from fleetgen.queue.acks import ACKS
from fleetgen.queue.celeryconf import make_app
from fleetgen.queue.serverclock import server_time
from fleetgen.queue.wire import (
    IN_FLIGHT,
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    LEASES,
    SWEEP_DUE,
    held_key,
    task_message,
)


def _settled(within_s: float = 5) -> None:
    """An ack's Redis work runs on the acks thread (fleetgen/queue/acks.py): until it has."""
    assert ACKS.settle(within_s), "an ack still waits on Valkey"


_OPEN: list[Any] = []  # the connections of this test's channels


@pytest.fixture(autouse=True)
def _close_channels() -> Iterator[None]:
    """Each channel closed before the test's Valkey stops: one left open hands back what it
    holds from kombu's exit hook (`restore_unacked_once`), to a Valkey gone by then, and
    prints a traceback per channel at the end of the run."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def _channel(url: str) -> broker.Channel:
    app = make_app(url, visibility_timeout_s=60)
    conn = app.connection_for_write()
    _OPEN.append(conn)
    assert isinstance(conn.transport, broker.Transport)
    channel = conn.default_channel
    assert isinstance(channel, broker.Channel)
    return channel


def test_the_app_uses_one_client_per_channel_and_pool(redis_url: str) -> None:
    channel = _channel(redis_url)
    first = channel._create_client()
    assert channel._create_client() is first
    with channel.conn_or_acquire() as client:
        assert client is first
    # The BRPOP client is kombu's own, on the async pool.
    assert channel._create_client(asynchronous=True) is not first
    channel._disconnect_pools()  # what kombu does after a fork
    again = channel._create_client()
    assert again is not first and again.connection_pool is channel.pool
    assert again.ping()


def test_unacked_copy_and_ack_go_through_the_shared_client(
        redis_url: str, rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = _channel(redis_url)
    channel._create_client()  # the one synchronous client, made before counting
    made: list[object] = []
    make = channel.Client

    def counted(**kwargs: object) -> object:
        made.append(kwargs)
        return make(**kwargs)

    monkeypatch.setattr(channel, "Client", counted)  # kombu makes every client through it
    message = channel.prepare_message("body", properties={"delivery_tag": "tag-1"})
    message["properties"]["delivery_info"] = {"exchange": "", "routing_key": "fleetgen"}
    channel.qos.append(channel.Message(message, channel=channel), "tag-1")
    assert rclient.hexists(KOMBU_UNACKED, "tag-1")
    assert rclient.zscore(KOMBU_UNACKED_INDEX, "tag-1") is not None
    channel.qos.ack("tag-1")
    _settled()
    assert not rclient.hexists(KOMBU_UNACKED, "tag-1")
    assert rclient.zcard(KOMBU_UNACKED_INDEX) == 0
    assert made == [], "kombu made a new Redis client for the unacked copy or the ack"



def test_the_unacked_copy_is_what_kombu_restores(redis_url: str, rclient: redis.Redis) -> None:
    """The copy orjson writes is read back by kombu's own `restore_by_tag` (its stdlib JSON):
    the message returns to the queue it came from, body and properties as delivered."""
    channel = _channel(redis_url)
    message = channel.prepare_message("a body", properties={"delivery_tag": "tag-2"},
                                      headers={"task": "t", "retries": 0})
    message["properties"]["delivery_info"] = {"exchange": "", "routing_key": "fleetgen"}
    channel.qos.append(channel.Message(message, channel=channel), "tag-2")
    copy = json.loads(rclient.hget(KOMBU_UNACKED, "tag-2") or b"")
    assert copy == [message, "", "fleetgen"]
    channel.qos.restore_by_tag("tag-2")
    assert not rclient.hexists(KOMBU_UNACKED, "tag-2")
    (queued,) = rclient.lrange("fleetgen", 0, -1)
    back = json.loads(queued)
    # kombu flags what it restores (`_do_restore_message`): the rest is as delivered.
    assert back["body"] == "a body"
    assert back["headers"] == {"task": "t", "retries": 0, "redelivered": True}
    assert back["properties"]["delivery_tag"] == "tag-2"


def test_the_json_decoder_is_orjsons_for_plain_json(monkeypatch: pytest.MonkeyPatch) -> None:
    make_app("redis://127.0.0.1:1/0", visibility_timeout_s=60)  # registers it
    stdlib: list[object] = []
    real = kombu_json.loads

    def counted(data: object) -> object:
        stdlib.append(data)
        return real(data)

    # kombu's registry holds its decoder itself; ours falls back through kombu_json.loads.
    assert serialization.registry._decoders["application/json"] is broker.json_loads
    monkeypatch.setattr(kombu_json, "loads", counted)
    body = b'[[{"run": "r", "input_ids": [1, 2, 3]}], {}, {"callbacks": null}]'
    assert serialization.loads(body, "application/json", "utf-8", accept={"application/json"}
                               ) == [[{"run": "r", "input_ids": [1, 2, 3]}], {},
                                     {"callbacks": None}]
    assert stdlib == [], "plain JSON went through the stdlib"


@pytest.mark.parametrize("value", [
    datetime(2026, 12, 1, 21, 0, tzinfo=UTC),  # kombu's typed value
    uuid.UUID(int=7),
    float("nan"),  # JSON orjson refuses (the stdlib writes it)
])
def test_what_orjson_cannot_read_as_kombu_wrote_it_is_kombus(value: object) -> None:
    make_app("redis://127.0.0.1:1/0", visibility_timeout_s=60)
    encoded = kombu_json.dumps({"v": value, "ids": [1, 2]})
    decoded = serialization.loads(encoded.encode(), "application/json", "utf-8",
                                  accept={"application/json"})
    assert decoded == kombu_json.loads(encoded)
    if isinstance(value, float):
        assert math.isnan(decoded["v"])
    else:
        assert decoded["v"] == value and type(decoded["v"]) is type(value)


def _held(channel: broker.Channel, tag: str) -> None:
    message = channel.prepare_message("a prompt", properties={"delivery_tag": tag})
    message["properties"]["delivery_info"] = {"exchange": "", "routing_key": "fleetgen"}
    channel.qos.append(channel.Message(message, channel=channel), tag)


def _zadds(rclient: redis.Redis) -> int:
    return int(rclient.info("commandstats").get("cmdstat_zadd", {}).get("calls", 0))


def test_a_renewed_lease_is_not_swept_and_a_lapsed_one_is(redis_url: str,
                                                          rclient: redis.Redis) -> None:
    """Each channel holds its prompts under one lease (its holder's, in `wire.LEASES`), which
    the heartbeat's `beat` moves to Valkey's now with one ZADD however many it holds (one a
    prompt before: 64,500 a second at 1,000 workers of 129); the sweep (`restore_visible`, 60 s
    timeout) hands back what a holder whose lease lapsed held and leaves a live one's."""
    live, dead = _channel(redis_url), _channel(redis_url)
    rclient.delete("fleetgen")
    tags = [f"live-{i}" for i in range(5)]
    for tag in [*tags, "acked"]:
        _held(live, tag)
    live.qos.ack("acked")
    _settled()
    _held(dead, "dead")
    lapsed = server_time(rclient) - 61  # renewed last 61 s ago: past a 60 s lease
    rclient.zadd(LEASES, {live.qos.holder: lapsed, dead.qos.holder: lapsed})
    before = _zadds(rclient)
    assert live.qos.held() == 5
    assert _beat(live) is None  # the closing key: unset
    assert _zadds(rclient) - before == 1, "a renewal wrote more than the holder's lease"
    renewed = rclient.zscore(LEASES, live.qos.holder)
    assert renewed is not None and renewed == pytest.approx(server_time(rclient), abs=5)
    live.qos.restore_visible(num=None, interval=1)
    assert rclient.smembers(held_key(live.qos.holder)) == {t.encode() for t in tags}
    assert sorted(rclient.hkeys(KOMBU_UNACKED)) == [t.encode() for t in tags]
    (back,) = rclient.lrange("fleetgen", 0, -1)
    assert json.loads(back)["properties"]["delivery_tag"] == "dead"
    assert rclient.zscore(LEASES, dead.qos.holder) is None
    assert not rclient.exists(held_key(dead.qos.holder))
    for tag in tags:
        live.qos.ack(tag)
    _settled()
    assert live.qos.held() == 0 and not rclient.exists(held_key(live.qos.holder))


def _beat(channel: Any, key: str = "beat") -> Any:
    return channel.qos.beat(key, {"held": channel.qos.held()}, 30, "closing")


def test_the_beat_is_one_script_on_valkeys_clock(redis_url: str, rclient: redis.Redis) -> None:
    """The heartbeat hash is written by the renewal's own script: one round trip a beat (two
    before: 1,000 a second at 1,000 workers), its `at` Valkey's time of the renewal whatever
    this host's clock says, `skew_s` this host's clock less Valkey's, the TTL set, and the
    closing key's value returned."""
    channel = _channel(redis_url)
    _beat(channel)  # the script loaded
    rclient.set("closing", "run-7")
    ahead = server_time(rclient) + 120.0  # this host's clock two minutes ahead
    before = _commands(rclient)
    with mock.patch("time.time", return_value=ahead):
        assert channel.qos.beat("beat", {"held": 0, "engine": "e"}, 30, "closing") == b"run-7"
    ran = {name: n - before.get(name, 0) for name, n in _commands(rclient).items()
           if n != before.get(name, 0) and name != "info"}
    assert ran == {"evalsha": 1, "time": 1, "zadd": 1, "hset": 1, "expire": 1, "get": 1}
    beat = {k.decode(): v.decode() for k, v in rclient.hgetall("beat").items()}
    assert beat["held"] == "0" and beat["engine"] == "e"
    assert float(beat["at"]) == pytest.approx(server_time(rclient), abs=5)
    assert float(beat["at"]) == rclient.zscore(LEASES, channel.qos.holder)
    assert float(beat["skew_s"]) == pytest.approx(120.0, abs=5)
    assert 0 < rclient.ttl("beat") <= 30


def _commands(rclient: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in rclient.info("commandstats").items()}


def test_a_worker_takes_its_own_queue_before_the_shared_one(redis_url: str,
                                                             rclient: redis.Redis) -> None:
    """kombu's BRPOP (`Channel._brpop_start`) names the queues in the cycle's order and takes
    from the first that holds a message; kombu's default cycle rotates the queue just served
    to the end, so a next turn in the worker's own queue waited behind every other message of
    the shared one. OwnQueueFirst keeps the own queue first: all three own messages come
    before any of the shared queue's, taken in the order the worker really consumes."""
    from kombu import Consumer, Queue

    from fleetgen.queue.contract import QUEUE, worker_queue

    app = make_app(redis_url, visibility_timeout_s=60)
    own = worker_queue("gpu0@host")
    with app.connection_for_write() as conn:
        producer = conn.Producer()
        for k in range(3):
            producer.publish({"q": "shared", "k": k}, routing_key=QUEUE, serializer="json")
            producer.publish({"q": "own", "k": k}, routing_key=own, serializer="json")
        taken: list[str] = []

        def on_message(body: dict[str, object], message: object) -> None:
            taken.append(str(body["q"]))
            message.ack()  # type: ignore[attr-defined]

        # Shared queue consumed first, as Celery's worker does (the gate adds its own after).
        with Consumer(conn, [Queue(QUEUE), Queue(own)], callbacks=[on_message],
                      accept=["json"]):
            while len(taken) < 6:
                conn.drain_events(timeout=5)
    assert taken == ["own"] * 3 + ["shared"] * 3


def test_a_take_parses_the_prompt_once_for_the_index_and_celery(redis_url: str,
                                                                rclient: redis.Redis) -> None:
    """The in-flight entry ("<slot> <run>") is read from kombu's decode of the body, cached on
    the message, which Celery's strategy reads next: the token ids are parsed once per take."""
    channel = _channel(redis_url)
    payload = {"run": "r", "line": 7, "id": "x", "input_ids": [1, 2, 3], "max_tokens": 5}
    message = channel.Message(orjson.loads(task_message(payload)), channel=channel)  # type: ignore[arg-type]
    channel.qos.append(message, message.delivery_tag)
    assert rclient.hget(IN_FLIGHT, message.delivery_tag) == b"7 r"
    assert message._decoded_cache is not None, "the body was parsed outside kombu's cache"
    assert message.payload[0][0] == payload
    channel.qos.ack(message.delivery_tag)
    _settled()
    assert not rclient.hexists(IN_FLIGHT, message.delivery_tag)


def _swept_and_retaken(redis_url: str, rclient: redis.Redis, tag: str) -> tuple[Any, Any]:
    """`cut` took `tag` and its lease lapsed (a worker cut off from Valkey past the lease); a
    sweep handed the message back and `other` took it again under the same tag."""
    cut, other = _channel(redis_url), _channel(redis_url)
    rclient.delete("fleetgen")
    _held(cut, tag)
    rclient.zadd(LEASES, {cut.qos.holder: server_time(rclient) - 61})
    rclient.delete(SWEEP_DUE)
    other.qos.restore_visible(num=None, interval=1)
    assert rclient.lpop("fleetgen") is not None, "the sweep did not hand the message back"
    _held(other, tag)
    return cut, other


def _still_held_by(rclient: redis.Redis, channel: Any, tag: str) -> None:
    assert rclient.hexists(KOMBU_UNACKED, tag), "the other worker's unacked copy is gone"
    assert rclient.zscore(KOMBU_UNACKED_INDEX, tag) is not None
    assert rclient.sismember(held_key(channel.qos.holder), tag)


def test_a_late_ack_leaves_the_copy_of_the_worker_that_took_it_again(
        redis_url: str, rclient: redis.Redis) -> None:
    """Issue 52, point 2: a worker cut off from Valkey past its lease acknowledges after the
    heal (an answer refused as late, or a failure acked): the ack removes the message only if
    this holder still holds it (one script). Before, it removed by delivery tag whoever held it
    now, and the worker that had re-taken it held a prompt with no crash-safe copy."""
    cut, other = _swept_and_retaken(redis_url, rclient, "retaken")
    cut.qos.ack("retaken")
    _settled()
    _still_held_by(rclient, other, "retaken")
    assert cut.qos.held() == 0, "the late ack is still counted as held in the worker"
    other.qos.ack("retaken")
    _settled()
    assert not rclient.hexists(KOMBU_UNACKED, "retaken")
    assert not rclient.exists(held_key(other.qos.holder))


@pytest.mark.parametrize("how", ["reject-requeue", "reject", "hand-back"])
def test_a_late_reject_or_hand_back_leaves_the_other_workers_copy(
        redis_url: str, rclient: redis.Redis, how: str) -> None:
    """The same for a late reject (EngineGone hands the prompt back with requeue) and the
    hand-back at shutdown: no second copy in the queue, the other worker's copy kept."""
    cut, other = _swept_and_retaken(redis_url, rclient, "retaken-2")
    if how == "hand-back":
        cut.qos.restore_unacked()
    else:
        cut.qos.reject("retaken-2", requeue=how == "reject-requeue")
        _settled()
    _still_held_by(rclient, other, "retaken-2")
    assert rclient.llen("fleetgen") == 0, "a second copy of a held message was queued"


def test_an_ack_waits_on_valkey_off_the_calling_thread(redis_url: str,
                                                      rclient: redis.Redis) -> None:
    """Celery calls `QoS.ack` on its consumer loop (fleetgen/queue/acks.py): with Valkey
    holding writes (`CLIENT PAUSE ... WRITE`), the ack returns at once and frees its slot in
    memory, while its script waits on the acks thread and lands after the pause."""
    channel = _channel(redis_url)
    _held(channel, "slow")
    assert channel.qos.held() == 1
    # 4 s of pause, 3 s of bound: an ack that waited on it fails, a stalled machine does not.
    rclient.execute_command("CLIENT", "PAUSE", 4000, "WRITE")
    started = time.monotonic()
    channel.qos.ack("slow")
    returned_s = time.monotonic() - started
    assert returned_s < 3.0, f"the ack waited {returned_s:.1f} s on the paused Valkey"
    assert channel.qos.held() == 0 and ACKS.pending() == 1
    assert rclient.hexists(KOMBU_UNACKED, "slow"), "the pause did not hold the ack's write"
    _settled(10)  # the 4 s pause and room for a stall
    assert time.monotonic() - started > 3.0, "the ack landed before the pause ended"
    assert not rclient.hexists(KOMBU_UNACKED, "slow")


def test_a_hand_back_waits_for_the_acks_given_before_it(redis_url: str,
                                                       rclient: redis.Redis) -> None:
    """An acked tag stays in kombu's `_delivered` until its `_flush`: a hand-back (SIGTERM,
    workers/handback.py; a channel closing) made while its ack waited on Valkey would have put
    an answered prompt back in the queue. It waits for the ack, then hands back the rest."""
    channel = _channel(redis_url)
    rclient.delete("fleetgen")
    _held(channel, "answered")
    _held(channel, "running")
    rclient.execute_command("CLIENT", "PAUSE", 1000, "WRITE")
    channel.qos.ack("answered")
    channel.qos.restore_unacked()
    (back,) = rclient.lrange("fleetgen", 0, -1)
    assert json.loads(back)["properties"]["delivery_tag"] == "running"
    assert not rclient.exists(KOMBU_UNACKED)
