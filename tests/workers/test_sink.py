"""The stream sink's bookkeeping: what `status` reads per worker is written, a counter that did
not move costs no command, and the outcome, its done bit and its counters land together."""

from __future__ import annotations

import redis

from fleetgen.monitor.status import gather
from fleetgen.queue.contract import KIND_FAILURE, KIND_RESULT
from fleetgen.runstate.keys import RunKeys
from workers.sink import StreamSink


def test_counters_status_reads_per_worker_and_no_zero_increments(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.hset(RunKeys("s").manifest, mapping={"total": 3, "started_at": 0})
    sink = StreamSink(client, worker="gpu0@h")
    result = {"id": "a", "line": 1, "completion": "x"}
    sink.emit("s", KIND_RESULT, 1, result, {"done": 1, "truncated": 0, "retries": 0,
                                             "prompt_tokens": 30, "completion_tokens": 7})
    sink.emit("s", KIND_RESULT, 2, {**result, "id": "b", "line": 2},
              {"done": 1, "truncated": 1, "retries": 2, "prompt_tokens": 30,
               "completion_tokens": 9})
    sink.emit("s", KIND_FAILURE, 3, {"id": "c", "line": 3}, {"failed": 1, "retries": 0},
              {"id": "c", "line": 3})
    stats = {k.decode(): int(v) for k, v in client.hgetall(RunKeys("s").stats).items()}
    assert stats == {"done": 2, "truncated": 1, "retries": 2, "prompt_tokens": 60,
                     "completion_tokens": 16, "failed": 1, "gpu0@h|done": 2,
                     "gpu0@h|completion_tokens": 16, "gpu0@h|failed": 1}
    assert client.xlen(RunKeys("s").stream) == 3
    assert [client.getbit(RunKeys("s").done, line) for line in (1, 2, 3)] == [1, 1, 1]
    status = gather(client, "s")
    assert status is not None
    (worker,) = status.workers
    assert (worker.name, worker.done, worker.failed, worker.completion_tokens) == \
        ("gpu0@h", 2, 1, 16)


def test_a_second_outcome_for_a_done_row_writes_nothing(redis_url: str) -> None:
    """A worker frozen past its lease finishes a prompt another worker has answered since: its
    late answer is refused in the same script that would write it (no second stream entry, no
    counter twice), and a row `fleetgen retry` sent back (done bit cleared) is written again."""
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys("late")
    client.hset(keys.manifest, mapping={"total": 1, "started_at": 0})
    first, late = StreamSink(client, worker="gpu0@h"), StreamSink(client, worker="gpu1@h")
    record = {"id": "a", "line": 1, "completion": "x"}
    assert first.emit("late", KIND_RESULT, 1, record, {"done": 1, "completion_tokens": 7})
    assert not late.emit("late", KIND_RESULT, 1, {**record, "worker": "gpu1@h"},
                         {"done": 1, "completion_tokens": 9})
    assert client.xlen(keys.stream) == 1
    stats = {k.decode(): int(v) for k, v in client.hgetall(keys.stats).items()}
    assert stats == {"done": 1, "completion_tokens": 7, "gpu0@h|done": 1,
                     "gpu0@h|completion_tokens": 7}
    client.setbit(keys.done, 1, 0)  # what `fleetgen retry` does (lifecycle.mark_retrying)
    assert late.emit("late", KIND_RESULT, 1, record, {"done": 1})
    assert client.xlen(keys.stream) == 2


def test_an_outcome_is_written_once_valkey_answers_again(redis_url: str) -> None:
    """Issue 52: with Valkey out of reach past the client's own retries (a cut of minutes),
    the outcome's write is tried again until it goes through, instead of failing the task,
    whose ack on failure removed the message with the answer lost."""
    client = redis.Redis.from_url(redis_url)
    client.hset(RunKeys("c").manifest, mapping={"total": 1, "started_at": 0})
    slept: list[float] = []
    sink = StreamSink(client, worker="gpu0@h", sleep=slept.append)
    real = sink._emit
    failures = [redis.TimeoutError("Timeout reading from socket"),
                redis.ConnectionError("Error 113 connecting: No route to host")]

    def flaky(**kwargs: object) -> object:
        if failures:
            raise failures.pop(0)
        return real(**kwargs)

    sink._emit = flaky  # type: ignore[method-assign]
    assert sink.emit("c", KIND_RESULT, 1, {"id": "a", "line": 1}, {"done": 1})
    assert len(slept) == 2 and client.xlen(RunKeys("c").stream) == 1
