"""`fleetgen status` counts as the output files do: a row delivered twice (a short visibility
timeout hands it to a second worker while the first still runs it) is one line in the files
and one outcome in status, with the run complete, on a real Valkey with the real sink and the
real drainer."""

from __future__ import annotations

from pathlib import Path

import orjson
import redis

from fleetgen.drainer import Drainer
from fleetgen.monitor.status import gather
from fleetgen.queue.contract import KIND_RESULT
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_COMPLETE
from workers.sink import StreamSink

RUN = "twice"


def start_run(client: redis.Redis, total: int) -> None:
    client.hset(RunKeys(RUN).manifest, mapping={"started_at": 1000, "state": "produced",
                                                "total": total, "read": total})


def answer(sink: StreamSink, line: int) -> bool:
    record = {"id": f"r{line}", "line": line, "completion": "x", "finish_reason": "stop",
              "prompt_tokens": 5, "completion_tokens": 3, "max_tokens": 100}
    return sink.emit(RUN, KIND_RESULT, line, record,
                     {"done": 1, "prompt_tokens": 5, "completion_tokens": 3})


def drain(client: redis.Redis, out: Path) -> None:
    drainer = Drainer(client, RUN, out)
    drainer.recover()
    drainer.run_until_complete()
    drainer.close()


def result_lines(out: Path) -> list[int]:
    return [orjson.loads(x)["line"] for x in (out / "results.jsonl").read_text().splitlines()]


def test_a_row_delivered_twice_is_one_outcome_in_status(rclient: redis.Redis,
                                                        tmp_path: Path) -> None:
    start_run(rclient, 3)
    first, second = StreamSink(rclient, worker="gpu0@h"), StreamSink(rclient, worker="gpu1@h")
    assert answer(first, 1) and answer(first, 2) and answer(first, 3)
    assert not answer(second, 2)  # the late answer of the second delivery: refused
    drain(rclient, tmp_path)
    status = gather(rclient, RUN)
    assert status is not None
    assert sorted(result_lines(tmp_path)) == [1, 2, 3]
    assert (status.done, status.total, status.written, status.state) == \
        (3, 3, 3, STATE_COMPLETE)


def test_counters_that_counted_a_row_twice_give_way_to_the_files(rclient: redis.Redis,
                                                                 tmp_path: Path) -> None:
    # A worker of a version without the done-bit check wrote its late answer: a second stream
    # entry and the counters twice. The drainer writes the row once; status says so.
    start_run(rclient, 3)
    first, old = StreamSink(rclient, worker="gpu0@h"), StreamSink(rclient, worker="gpu1@h")
    assert answer(first, 1) and answer(first, 2) and answer(first, 3)
    rclient.setbit(RunKeys(RUN).done, 2, 0)  # what the old worker did not look at
    assert answer(old, 2)
    assert rclient.hget(RunKeys(RUN).stats, "done") == b"4"
    drain(rclient, tmp_path)
    status = gather(rclient, RUN)
    assert status is not None
    assert sorted(result_lines(tmp_path)) == [1, 2, 3]
    assert (status.done, status.completion_tokens, status.written, status.state) == \
        (3, 9, 3, STATE_COMPLETE)
    assert status.done + status.failed + status.rejected <= (status.total or 0)
