"""The end of a Redis that served one run (`fleetgen run`'s or the demo's own Valkey): the run
announces it once complete, the workers that joined from other hosts and the live pages that
watch it see the end, and the run waits for them (bounded) before its Valkey stops. Without
this, a joined worker retried the vanished Redis forever and a page kept its last figures
short of the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from fleetgen.queue.contract import closing_key, watcher_key, worker_key
from fleetgen.queue.heartbeat import Heartbeat
from fleetgen.queue.redisconn import read_hash, text
from fleetgen.queue.serverclock import LUA_NOW, server_time

# Periods of its own a watcher's mark outlives its last read: a page stopped by Ctrl-C is no
# longer waited for.
WATCHER_TTL_PERIODS = 3
# The longest a closing run waits for a slow page (its --interval) or a joined worker's
# warm shutdown: past it the Valkey stops anyway, and the run says who did not see the end.
MAX_WAIT_S = 30.0
# A page's read on Valkey's clock, as the announcement's time: a page on a host whose clock is
# ahead must not look as if it had read the end (nor one behind as if it never would).
_MARK = LUA_NOW + """
redis.call('SET', KEYS[1], now .. ' ' .. ARGV[1], 'EX', ARGV[2])
return 1
"""


def announce(client: redis.Redis, run: str) -> float:
    """The run is complete and this Redis stops next; returns when it was said (epoch s,
    Valkey's clock)."""
    client.set(closing_key(), run)
    return server_time(client)  # read after the SET: a read marked later saw the key


def closing(value: bytes | str | None) -> str | None:
    """The run a GET of `closing_key` names (None: the Redis is not closing)."""
    return text(value) if value else None


def mark_watcher(pipe: redis.client.Pipeline, watcher: str, interval_s: float) -> None:
    """A live page's read, added to its sampling pipeline."""
    ttl_s = max(int(WATCHER_TTL_PERIODS * interval_s) + 1, 2)
    pipe.eval(_MARK, 1, watcher_key(watcher), interval_s, ttl_s)


@dataclass(frozen=True)
class Pending:
    workers: list[str]  # joined workers whose heartbeat is still there
    watchers: int  # live pages that have not read since the announcement
    wait_s: float  # how long the slowest of them may still take


def pending(client: redis.Redis, own: Iterable[str], announced_at: float,
            now: float | None = None) -> Pending:
    """Who has not seen the end yet: joined (not `own`) workers still beating, and pages
    whose last read is older than the announcement (all on Valkey's clock)."""
    now = server_time(client) if now is None else now
    own_names = set(own)
    workers, wait_s = [], 0.0
    for key in client.scan_iter(match=worker_key("*"), count=1000):
        name = text(key)[len(worker_key("")):]
        beat = Heartbeat.of(read_hash(client, text(key)))
        if name in own_names or beat.lost(now):  # a dead worker sees nothing: not waited for
            continue
        workers.append(name)
        wait_s = max(wait_s, 3 * beat.interval_s)
    watchers = 0
    for key in client.scan_iter(match=watcher_key("*"), count=1000):
        at, _, interval = text(client.get(key) or "0 0").partition(" ")
        if float(at or 0) < announced_at:
            watchers += 1
            wait_s = max(wait_s, 2 * float(interval or 0))
    return Pending(sorted(workers), watchers, wait_s)


def wait_for_leavers(client: redis.Redis, own: Iterable[str], announced_at: float, *,
                     should_stop: Callable[[], bool] = lambda: False,
                     poll_s: float = 0.2) -> Pending:
    """Until every joined worker has left and every page has read the end, or the slowest
    one's time (at most MAX_WAIT_S) is up; returns who is still pending then."""
    own = list(own)
    left = pending(client, own, announced_at)
    deadline = time.monotonic() + min(left.wait_s + 2.0, MAX_WAIT_S)
    while (left.workers or left.watchers) and time.monotonic() < deadline \
            and not should_stop():
        time.sleep(poll_s)  # the poll period of a bounded wait on other processes
        left = pending(client, own, announced_at)
    return left
