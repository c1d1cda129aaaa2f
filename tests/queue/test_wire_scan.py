"""The scans of the shared queue and of kombu's unacked hash (fleetgen/queue/wire.py) against a
real Valkey: exact answers, and never one reply holding the whole queue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from fleetgen.queue.acks import ACKS
from fleetgen.queue.contract import QUEUE, TaskPayload
from fleetgen.queue.wire import (
    IN_FLIGHT,
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    SCAN_PAGE,
    remove_tasks,
    requeue_unacked,
    slots_in_flight,
    task_message,
    task_payload,
)


def _message(run: str, line: int) -> bytes:
    payload = TaskPayload(run=run, line=line, id=f"{run}-{line}", input_ids=[1, 2, 3],
                          max_tokens=8, sampling={}, row={})
    return task_message(payload)


@pytest.fixture
def channel(redis_url: str) -> Iterator[Any]:
    """A channel of fleetgen's transport, closed before the test's Valkey stops (an unclosed
    one hands its messages back at exit, to a Valkey gone by then)."""
    from kombu import Connection

    from fleetgen.queue.broker import Transport

    with Connection(redis_url, transport=Transport) as connection:
        yield connection.default_channel


def _fill(client: redis.Redis, queued: dict[str, range], unacked: dict[str, range]) -> None:
    for run, lines in queued.items():
        client.lpush(QUEUE, *(_message(run, n) for n in lines))
    for run, lines in unacked.items():
        for n in lines:
            tag = f"tag-{run}-{n}"
            entry = [orjson.loads(_message(run, n)), "", QUEUE]
            client.hset(KOMBU_UNACKED, tag, orjson.dumps(entry))
            client.zadd(KOMBU_UNACKED_INDEX, {tag: 1.0})


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_slots_in_flight_pages_through_a_deep_shared_queue(rclient: redis.Redis) -> None:
    queued_a, queued_b = range(1, 1001), range(1, 601)
    _fill(rclient, {"a": queued_a, "b": queued_b}, {"a": range(2001, 2301), "b": range(5, 9)})
    rclient.config_resetstat()
    found = slots_in_flight(rclient, "a")
    assert found == set(queued_a) | set(range(2001, 2301))
    depth = len(queued_a) + len(queued_b)
    # One LRANGE per page (the last one short), never LRANGE 0 -1; the hash by HSCAN.
    assert _calls(rclient, "lrange") == depth // SCAN_PAGE + 1
    assert _calls(rclient, "hscan") >= 2
    assert _calls(rclient, "hgetall") == 0


def test_a_page_scan_misses_nothing_while_producers_push(rclient: redis.Redis,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A push at the left end between two pages shifts every message right: the scan sees some
    twice and loses none."""
    _fill(rclient, {"a": range(1, 801)}, {})
    original = rclient.lrange

    def lrange_then_push(name: str, start: int, end: int) -> Any:
        page = original(name, start, end)
        rclient.lpush(QUEUE, *(_message("other", start + i) for i in range(100)))
        return page

    monkeypatch.setattr(rclient, "lrange", lrange_then_push)
    found = slots_in_flight(rclient, "a")
    assert found == set(range(1, 801))
    assert rclient.llen(QUEUE) >= 800 + 3 * 100  # the pushes landed between the pages


def test_remove_and_requeue_count_each_message_once(rclient: redis.Redis) -> None:
    _fill(rclient, {"gone": range(1, 700), "kept": range(1, 300)},
          {"gone": range(700, 1000), "kept": range(300, 310)})
    assert remove_tasks(rclient, "gone") == (699, 300)
    assert slots_in_flight(rclient, "gone") == set()
    assert rclient.llen(QUEUE) == 299
    assert rclient.hlen(KOMBU_UNACKED) == 10
    assert requeue_unacked(rclient) == 10
    assert rclient.hlen(KOMBU_UNACKED) == 0 and rclient.zcard(KOMBU_UNACKED_INDEX) == 0
    assert slots_in_flight(rclient, "kept") == set(range(1, 310))
    assert rclient.llen(QUEUE) == 309


def test_queued_counts_the_shared_queue_and_every_workers_own(rclient: redis.Redis) -> None:
    from fleetgen.queue.contract import QUEUE, worker_queue
    from fleetgen.queue.wire import queued

    rclient.rpush(QUEUE, "a", "b")
    rclient.rpush(worker_queue("gpu0@h"), "c")
    rclient.rpush(worker_queue("gpu1@h"), "d", "e", "f")
    assert queued(rclient) == 6


def test_held_lines_come_from_the_in_flight_index_not_the_copies(channel: Any,
                                                                 rclient: redis.Redis) -> None:
    """Messages held through fleetgen's transport are found from `IN_FLIGHT` (~50 bytes each)
    without reading their ~4.6 KB copies; an entry whose copy is gone (removed by a path that
    left it) is neither counted nor kept; an ack removes the entry with the copy."""
    rclient.delete(QUEUE, KOMBU_UNACKED, KOMBU_UNACKED_INDEX, IN_FLIGHT)
    rclient.lpush(QUEUE, *(_message("a", n) for n in range(1, 201)))
    held = [channel.basic_get(QUEUE, no_ack=False) for _ in range(150)]
    assert rclient.hlen(IN_FLIGHT) == 150
    channel.basic_ack(held[0].delivery_tag)
    # The ack's removal runs on the acks thread (fleetgen/queue/acks.py): read after it lands.
    assert ACKS.settle(5), "the ack still waits on Valkey"
    rclient.hset(IN_FLIGHT, "gone", "7 a")  # its copy is not in `unacked`
    before = int(rclient.info("stats")["total_net_output_bytes"])
    found = slots_in_flight(rclient, "a")
    read = int(rclient.info("stats")["total_net_output_bytes"]) - before
    assert found == set(range(1, 201)) - {task_payload(held[0]._raw)["line"]}  # type: ignore[index]
    copy_bytes = len(_message("a", 1))
    # The 50 queued messages are read whole; the 149 held ones only as their entries.
    assert read < 50 * copy_bytes + 149 * 100, (read, copy_bytes)
    assert not rclient.hexists(IN_FLIGHT, "gone") and rclient.hlen(IN_FLIGHT) == 149


def test_a_held_message_missing_from_the_index_is_still_in_flight(channel: Any,
                                                                  rclient: redis.Redis) -> None:
    """A copy without an IN_FLIGHT entry (an older worker's) is counted, even when a stale
    entry makes the index as long as the unacked hash; only such copies are read."""
    rclient.delete(QUEUE, KOMBU_UNACKED, KOMBU_UNACKED_INDEX, IN_FLIGHT)
    rclient.lpush(QUEUE, *(_message("a", n) for n in range(1, 101)))
    for _ in range(100):
        channel.basic_get(QUEUE, no_ack=False)
    _fill(rclient, {}, {"a": range(500, 501), "b": range(600, 601)})  # copies, no entries
    # ... and two stale entries (their copies gone): the counts are equal.
    rclient.hset(IN_FLIGHT, mapping={"gone": "7 a", "gone-too": "8 a"})
    assert rclient.hlen(IN_FLIGHT) == rclient.hlen(KOMBU_UNACKED)
    before = int(rclient.info("stats")["total_net_output_bytes"])
    assert slots_in_flight(rclient, "a") == set(range(1, 101)) | {500}
    read = int(rclient.info("stats")["total_net_output_bytes"]) - before
    assert read < 2 * len(_message("a", 1)) + 100 * 100 + 2000, read


def test_unrenewed_leases_read_the_index_not_the_copies(channel: Any,
                                                        rclient: redis.Redis) -> None:
    """A dead holder's tags are told by run from their IN_FLIGHT entries; a copy is read only
    for a tag without one."""
    from fleetgen.queue.serverclock import server_time
    from fleetgen.queue.wire import LEASES, unrenewed_leases

    rclient.delete(QUEUE, KOMBU_UNACKED, KOMBU_UNACKED_INDEX, IN_FLIGHT, LEASES)
    rclient.lpush(QUEUE, *(_message("a", n) for n in range(1, 41)))
    rclient.lpush(QUEUE, *(_message("b", n) for n in range(1, 11)))
    for _ in range(50):
        channel.basic_get(QUEUE, no_ack=False)
    later = server_time(rclient) + 1
    before = int(rclient.info("stats")["total_net_output_bytes"])
    assert len(unrenewed_leases(rclient, "a", later)) == 40
    read = int(rclient.info("stats")["total_net_output_bytes"]) - before
    assert read < 50 * 200, read  # not one ~300-byte copy each
    rclient.hdel(IN_FLIGHT, channel.qos._held()[0])  # an older worker's: its copy is read
    assert len(unrenewed_leases(rclient, "a", later)) == 40
