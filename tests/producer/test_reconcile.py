"""Reconciliation: rows whose messages vanished (a Redis crash) are found and enqueued again,
and nothing else is; on a real Valkey, without workers, so the test controls every row."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import redis

from fleetgen.queue.contract import QUEUE
from fleetgen.queue.wire import task_payload
from fleetgen.runstate.keys import RunKeys
from tests.support.producers import prompts_producer
from tests.support.waiting import wait_until


def queued_lines(client: redis.Redis) -> list[int]:
    lines = []
    for raw in client.lrange(QUEUE, 0, -1):
        payload = task_payload(orjson.loads(raw))
        assert payload is not None
        lines.append(int(payload["line"]))
    return sorted(lines)


def test_lost_rows_are_enqueued_again_and_only_they(rclient: redis.Redis, redis_url: str,
                                                    tmp_path: Path) -> None:
    producer = prompts_producer(rclient, redis_url, tmp_path, "rc", 40)
    producer.send_pass()
    assert queued_lines(rclient) == list(range(1, 41))
    # Rows 1-10 are "generated"; 11-15 vanish with a Redis crash; 16-40 stay queued.
    done = RunKeys("rc").done
    for line in range(1, 11):
        rclient.setbit(done, line, 1)
    rclient.ltrim(QUEUE, 0, -16)  # LPUSHed first = rightmost: drops lines 1-15
    assert producer.lost_lines() == set(range(11, 16))

    requeued: list[int] = []
    waiter = threading.Thread(target=lambda: requeued.append(
        producer.wait_until_generated(interval_s=0.2)), daemon=True)
    waiter.start()
    # The lost rows come back (after two checks), the queued ones are not sent twice.
    wait_until(lambda: len(queued_lines(rclient)) >= 30, 20, "the lost rows to come back")
    assert queued_lines(rclient) == list(range(11, 41))
    for line in range(11, 41):  # a worker would now generate them
        rclient.setbit(done, line, 1)
    waiter.join(10)
    assert requeued == [5]
