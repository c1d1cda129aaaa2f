"""A closing run's wait for those that have not seen its end (fleetgen/queue/closing.py), on
hosts whose clocks disagree with each other and with Valkey's: a live page's read and the
announcement are both on Valkey's clock, and so are the joined workers' heartbeats."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from fleetgen.queue import closing, heartbeat
from fleetgen.queue.contract import worker_key
from fleetgen.queue.serverclock import server_time

SKEW_S = 120.0  # NTP off on one host


@pytest.fixture(autouse=True)
def _flushed_after(rclient: redis.Redis) -> Iterator[None]:
    yield
    rclient.flushall()  # a closing key left behind would send a later test's workers away


def skewed(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + by_s)


def test_a_page_on_a_host_ahead_still_reads_the_end(rclient: redis.Redis,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The page's host is 120 s ahead: it reads the run before the announcement...
    with monkeypatch.context() as m:
        skewed(m, SKEW_S)
        pipe = rclient.pipeline()
        closing.mark_watcher(pipe, "page-ahead", 2.0)
        pipe.execute()
    # ...then the run (on a host with the right time) says it is closing.
    at = closing.announce(rclient, "r-closing")
    left = closing.pending(rclient, [], at)
    assert left.watchers == 1 and left.wait_s == 4.0  # not taken for a page that saw the end
    pipe = rclient.pipeline()
    closing.mark_watcher(pipe, "page-ahead", 2.0)
    pipe.execute()
    assert closing.pending(rclient, [], at).watchers == 0


def test_a_joined_worker_is_waited_for_on_valkeys_clock(
        rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    rclient.hset(worker_key("gpu0@other"), mapping=heartbeat.fields(
        interval_s=2.0, lease_s=60.0, sweep_s=5.0, held=0, now=server_time(rclient)))
    rclient.hset(worker_key("gpu0@here"), mapping=heartbeat.fields(
        interval_s=2.0, lease_s=60.0, sweep_s=5.0, held=0, now=server_time(rclient)))
    skewed(monkeypatch, SKEW_S)  # the run's host is 120 s ahead of its Redis
    at = closing.announce(rclient, "r-closing")
    left = closing.pending(rclient, ["gpu0@here"], at)
    assert left.workers == ["gpu0@other"] and left.wait_s == 6.0  # beating: not taken for dead
