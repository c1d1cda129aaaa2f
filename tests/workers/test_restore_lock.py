"""A worker SIGKILLed in the middle of kombu's sweep for abandoned messages leaves the sweep's
lock held (kombu 5.7 transport/redis.py `QoS.restore_visible` -> `Mutex`); until it expires no
worker redelivers anything. kombu's default is 300 s, far past a test's deadline and half a
visibility timeout of ours; fleetgen's transport options shorten it (celeryconf
`mutex_expire_s`). A real kombu channel on a real Valkey: the message a dead worker held comes
back as soon as the lock a dead sweeper would leave has expired."""

from __future__ import annotations

import time

import pytest
import redis
from kombu import Connection

from fleetgen.queue.celeryconf import celery_config, mutex_expire_s
from tests.support.waiting import wait_until

VISIBILITY_S = 15


@pytest.mark.parametrize(("timeout_s", "expire_s"), [(15, 7), (4, 5), (7200, 300), (600, 300)])
def test_the_lock_expires_within_half_the_visibility_timeout(timeout_s: float,
                                                             expire_s: int) -> None:
    assert mutex_expire_s(timeout_s) == expire_s


def test_a_dead_sweepers_lock_delays_a_redelivery_only_until_it_expires(redis_url: str) -> None:
    options = celery_config(redis_url, visibility_timeout_s=VISIBILITY_S)
    client = redis.Redis.from_url(redis_url)
    with Connection(redis_url, transport_options=options["broker_transport_options"]) as conn:
        channel = conn.default_channel
        expire_s = channel.unacked_mutex_expire
        assert expire_s == mutex_expire_s(VISIBILITY_S) < 300
        queue = conn.SimpleQueue("restore-lock")
        queue.put({"prompt": 1})
        held = queue.get(block=True, timeout=5)  # taken, not acked: now in kombu's unacked
        assert client.hlen(channel.unacked_key) == 1 and client.llen("restore-lock") == 0
        # The worker that took it is gone, long enough ago to be past the visibility timeout...
        tag = held.delivery_tag
        client.zadd(channel.unacked_index_key, {tag: time.time() - VISIBILITY_S - 1})
        # ... and it died inside a sweep: its lock stays for as long as it was taken for.
        client.set(channel.unacked_mutex_key, "a dead worker's token", ex=expire_s)
        started = time.monotonic()

        def redelivered() -> bool:
            channel.qos.restore_visible(num=None, interval=1)  # what each live worker runs
            return client.llen("restore-lock") > 0

        wait_until(redelivered, expire_s + 3, "a redelivery after a sweeper died holding the "
                   "lock", poll_s=0.2)
        waited = time.monotonic() - started
        assert waited >= expire_s - 1, "the lock did not hold: the test proves nothing"
        assert client.hlen(channel.unacked_key) == 0
        queue.close()
    print(f"\nredelivered {waited:.1f} s after a sweeper died holding the lock "
          f"(expires after {expire_s} s; kombu's default would wait 300 s)")
