"""summary.json's numbers for runs that did not go straight through, with the real drainer on a
real Valkey: a run resumed after a stop counts the time it worked, not the time it stood
stopped; a run stopped early by --stop-if says how many rows its input has."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from fleetgen.drainer import Drainer
from fleetgen.monitor.status import gather
from fleetgen.queue.contract import KIND_RESULT
from fleetgen.records.outcomes import stream_entry
from fleetgen.runstate.keys import RunKeys

RUN = "clock"


def outcome_at(client: redis.Redis, line: int, at: float) -> None:
    """An outcome as a worker writes it (stream entry, done bit, counters), at time `at`: the
    stream id carries its time, as Redis gives it."""
    keys = RunKeys(RUN)
    record = {"id": f"r{line}", "line": line, "completion": "x", "finish_reason": "stop",
              "prompt_tokens": 5, "completion_tokens": 3, "max_tokens": 100}
    client.xadd(keys.stream, dict(stream_entry(KIND_RESULT, record)), id=f"{int(at * 1000)}-{line}")
    client.setbit(keys.done, line, 1)
    client.setbit(keys.sent, line, 1)
    client.hincrby(keys.stats, "done", 1)


def drain(client: redis.Redis, out: Path) -> dict[str, object]:
    drainer = Drainer(client, RUN, out)
    drainer.recover()
    drainer.run_until_complete()
    drainer.close()
    return drainer.write_summary()


def test_a_resumed_run_does_not_count_the_time_it_was_stopped(rclient: redis.Redis,
                                                              tmp_path: Path) -> None:
    now = time.time()
    keys = RunKeys(RUN)
    # Started 300 s ago; worked until 200 s ago (its last outcome, its drainer's last stamp),
    # then stopped; resumed now, it writes what is left.
    rclient.hset(keys.manifest, mapping={"started_at": now - 300, "state": "produced",
                                         "total": 2, "read": 2, "expected": 2})
    outcome_at(rclient, 1, now - 200)
    rclient.hset(keys.written, mapping={"done": 0, "active_at": now - 200})
    outcome_at(rclient, 2, now - 200 + 0.001)
    summary = drain(rclient, tmp_path)
    assert summary["complete"] and summary["done"] == 2
    assert 95 < float(summary["wall_s"]) < 130, summary  # 100 s worked, not 300
    assert 195 < float(summary["paused_s"]) < 205
    status = gather(rclient, RUN)
    assert status is not None and abs(status.elapsed_s - float(summary["wall_s"])) < 1
    # A drainer restarted on the ended run adds nothing.
    again = drain(rclient, tmp_path)
    assert again["wall_s"] == summary["wall_s"] and again["paused_s"] == summary["paused_s"]


def test_a_drainer_restarted_at_once_pauses_nothing(rclient: redis.Redis,
                                                    tmp_path: Path) -> None:
    now = time.time()
    keys = RunKeys(RUN)
    rclient.hset(keys.manifest, mapping={"started_at": now - 60, "state": "produced",
                                         "total": 1, "read": 1, "expected": 1})
    rclient.hset(keys.written, mapping={"done": 0, "active_at": now - 1})
    outcome_at(rclient, 1, now - 1)
    summary = drain(rclient, tmp_path)
    assert summary["paused_s"] == 0 and 59 < float(summary["wall_s"]) < 90


def test_a_run_stopped_early_counts_its_whole_input(rclient: redis.Redis,
                                                    tmp_path: Path) -> None:
    keys = RunKeys(RUN)
    # --stop-if stopped it after 3 of the input's 311 rows were sent and answered.
    rclient.hset(keys.manifest, mapping={
        "started_at": time.time() - 10, "state": "stopped", "stop_reason": "truncated > 0.2",
        "read": 3, "expected": 311})
    for line in (1, 2, 3):
        outcome_at(rclient, line, time.time())
    summary = drain(rclient, tmp_path)
    assert (summary["total"], summary["done"], summary["complete"], summary["stopped"]) == \
        (311, 3, False, "truncated > 0.2")
