"""The reliable take (fleetgen/queue/broker.py `_TAKE`, issue 52 point 1) against a real Valkey:
a message taken by a worker whose reply never arrives (a cut network: the reply is sent into
the cut and the worker drops the connection; a worker killed between the take and its record)
is never lost. It stays in the holder's taking list: the holder gets it again at its next take,
or, once the holder's lease has lapsed, the sweep hands it back to the queue. With kombu's BRPOP
it was in neither the queue nor `unacked`, and only a waiting producer brought its row back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Queue

from fleetgen.queue import broker
from fleetgen.queue.acks import ACKS
from fleetgen.queue.celeryconf import make_app
from fleetgen.queue.contract import QUEUE
from fleetgen.queue.serverclock import server_time
from fleetgen.queue.wire import KOMBU_UNACKED, LEASES, SWEEP_DUE


@contextmanager
def _consumer(redis_url: str, got: list[Any]) -> Iterator[tuple[Connection, broker.Channel]]:
    app = make_app(redis_url, visibility_timeout_s=60)
    with app.connection_for_write() as conn:
        def on_message(body: Any, message: Any) -> None:
            got.append((body, message))

        with Consumer(conn, [Queue(QUEUE)], callbacks=[on_message], accept=["json"]) as c:
            channel = c.channel
            assert isinstance(channel, broker.Channel)
            yield conn, channel


def _publish(redis_url: str, body: dict[str, Any]) -> None:
    app = make_app(redis_url, visibility_timeout_s=60)
    with app.connection_for_write() as conn:
        conn.Producer().publish(body, routing_key=QUEUE, serializer="json")


def _send_take(channel: broker.Channel, *, block: bool) -> None:
    """What kombu's poller does before it waits (`_register_BRPOP`): connect, send the take."""
    channel._block_next = block
    channel.connection.cycle._register_BRPOP(channel)


def _drop(channel: broker.Channel) -> None:
    """The worker drops the connection (kombu's stale BRPOP check, a keepalive timeout) while
    the take's reply is in the cut: never read."""
    time.sleep(0.3)  # Valkey has answered (the reply sits unread in the socket)
    channel.client.connection.disconnect()
    channel._in_poll = None  # type: ignore[assignment]
    channel._take_phase = None


def _reply_lost(channel: broker.Channel, *, block: bool) -> None:
    _send_take(channel, block=block)
    _drop(channel)


@pytest.mark.parametrize("block", [False, True], ids=["take", "blocking-take"])
def test_a_take_whose_reply_is_lost_is_given_again_to_its_holder(
        redis_url: str, rclient: redis.Redis, block: bool) -> None:
    got: list[Any] = []
    with _consumer(redis_url, got) as (conn, channel):
        if block:  # idle: the worker blocks on the queue, the message arrives meanwhile
            _send_take(channel, block=True)
            _publish(redis_url, {"n": 1})
            _drop(channel)
        else:
            _publish(redis_url, {"n": 1})
            _reply_lost(channel, block=False)
        taking = f"fleetgen:taking:{channel.qos.holder}"
        assert rclient.llen(QUEUE) == 0, "the take did not take"
        assert rclient.llen(taking) + rclient.hlen(KOMBU_UNACKED) == 1, \
            "the message taken into the cut is in neither the queue, nor unacked, nor taking"
        assert rclient.llen(taking) == 1
        conn.drain_events(timeout=5)
        assert [body for body, _ in got] == [{"n": 1}]
        assert rclient.llen(taking) == 0
        (message,) = [m for _, m in got]
        assert rclient.hexists(KOMBU_UNACKED, message.delivery_tag)
        message.ack()
        assert ACKS.settle(5), "the ack still waits on Valkey (fleetgen/queue/acks.py)"
        assert not rclient.hexists(KOMBU_UNACKED, message.delivery_tag)


def test_a_lapsed_holders_lost_take_is_swept_back_to_the_queue(
        redis_url: str, rclient: redis.Redis) -> None:
    """The holder never comes back (its host cut for good, or killed): once its lease lapses
    the sweep puts what it had taken back at the head of the queue."""
    got: list[Any] = []
    with _consumer(redis_url, got) as (_conn, channel):
        _publish(redis_url, {"n": 2})
        _reply_lost(channel, block=False)
        holder, taking = channel.qos.holder, channel.qos.taking_key
    assert rclient.llen(taking) == 1
    # The take gave the holder a lease (it had none: it never beat); it lapses.
    assert rclient.zscore(LEASES, holder) is not None
    rclient.zadd(LEASES, {holder: server_time(rclient) - 61})
    rclient.delete(SWEEP_DUE)
    sweeper = make_app(redis_url, visibility_timeout_s=60).connection_for_write().default_channel
    sweeper.qos.restore_visible(num=None, interval=1)
    assert rclient.llen(taking) == 0
    (back,) = rclient.lrange(QUEUE, 0, -1)
    assert json.loads(back)["properties"]["delivery_info"]["routing_key"] == QUEUE
    assert rclient.zscore(LEASES, holder) is None


def test_a_late_reply_after_the_sweep_is_not_run_twice(redis_url: str,
                                                      rclient: redis.Redis) -> None:
    """The cut outlasted the lease: the sweep handed the message back and another worker took
    it; then the late reply reaches the first worker (TCP retransmission after the heal). It
    is not recorded nor run there, and the other worker's copy stays."""
    got: list[Any] = []
    with _consumer(redis_url, got) as (conn, channel):
        _publish(redis_url, {"n": 3})
        _send_take(channel, block=False)  # the reply is on its way; not read yet
        time.sleep(0.3)
        rclient.zadd(LEASES, {channel.qos.holder: server_time(rclient) - 61})
        rclient.delete(SWEEP_DUE)
        other_got: list[Any] = []
        with _consumer(redis_url, other_got) as (other_conn, _other):
            _other.qos.restore_visible(num=None, interval=1)
            other_conn.drain_events(timeout=5)
            (other_message,) = [m for _, m in other_got]
            assert rclient.hexists(KOMBU_UNACKED, other_message.delivery_tag)
            with pytest.raises(Exception):  # noqa: B017 (Empty: kombu's loop drops it)
                channel._brpop_read()
            assert got == [], "the late reply was run a second time"
            assert rclient.hexists(KOMBU_UNACKED, other_message.delivery_tag)
            assert rclient.llen(QUEUE) == 0
            del conn


def test_a_take_valkey_refuses_is_tried_again(redis_url: str, rclient: redis.Redis,
                                              caplog: pytest.LogCaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The take is a script that writes, which a full Valkey refuses (OOM under noeviction,
    where kombu's BRPOP still went through): the worker says so and tries again a second later
    instead of ending its consumer; nothing is lost meanwhile."""
    got: list[Any] = []
    _publish(redis_url, {"n": 4})
    # `drain_events` sweeps after each empty poll (a worker sweeps on its own thread, where a
    # refused sweep is retried next period: `broker.Sweeper`): not this test's subject.
    monkeypatch.setattr(broker.QoS, "restore_visible", lambda self, *a, **k: None)
    with _consumer(redis_url, got) as (conn, _channel):
        rclient.config_set("maxmemory", 1)
        try:
            with pytest.raises(TimeoutError):
                conn.drain_events(timeout=1.5)
            assert "Valkey refused a take" in caplog.text
            assert rclient.llen(QUEUE) == 1
        finally:
            rclient.config_set("maxmemory", 0)
        conn.drain_events(timeout=5)
        assert [body for body, _ in got] == [{"n": 4}]
        got[0][1].ack()
