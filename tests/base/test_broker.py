"""fleetgen's kombu transport (fleetgen/base/broker.py) against a real Valkey: the Celery app
uses it, a channel makes its synchronous client once per pool, and kombu's unacked copy and
ack still work through it. TLS (rediss://) through it: tests/chaos/test_security.py."""

from __future__ import annotations

import pytest
import redis

from fleetgen.base import broker
from fleetgen.base.celeryconf import make_app
from fleetgen.base.wire import KOMBU_UNACKED, KOMBU_UNACKED_INDEX


def _channel(url: str) -> broker.Channel:
    app = make_app(url, visibility_timeout_s=60)
    conn = app.connection_for_write()
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
    assert not rclient.hexists(KOMBU_UNACKED, "tag-1")
    assert rclient.zcard(KOMBU_UNACKED_INDEX) == 0
    assert made == [], "kombu made a new Redis client for the unacked copy or the ack"

