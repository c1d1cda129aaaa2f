"""A worker asks whether a row is done only for a redelivered prompt: kombu flags every message
it restores (`redelivered` in the headers and delivery_info, kombu/transport/redis.py
`_do_restore_message`), and a message kombu restored is skipped when its row is done; a first
delivery is generated without the question. Exactly once rests on the drainer, which writes
one outcome per row whatever reaches the stream (tests/chaos)."""

from __future__ import annotations

from pathlib import Path

import orjson
import redis

from fleetgen.base.contract import QUEUE, RunKeys, TaskPayload
from fleetgen.base.wire import task_message
from fleetgen.local.procs import wait_for
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import run_in_thread
from tests.workers.workerproc import heartbeat_key, start_worker, stop


def _message(run: str, line: int, *, redelivered: bool) -> bytes:
    payload = TaskPayload(run=run, line=line, id=f"{run}{line}", input_ids=[1, 2, line + 3],
                          max_tokens=4, sampling={}, row={})
    message = orjson.loads(task_message(payload))
    if redelivered:  # what kombu writes when it restores a message
        message["headers"]["redelivered"] = True
        message["properties"]["delivery_info"]["redelivered"] = True
    return orjson.dumps(message)


def test_only_a_redelivered_prompt_of_a_done_row_is_skipped(redis_url: str,
                                                           tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys("redo")
    client.setbit(keys.done, 1, 1)
    client.setbit(keys.done, 2, 1)
    log = tmp_path / "w.log"
    with run_in_thread(SimConfig(port=0, ttft_ms=1, tpot_ms=0, health_delay_s=0)) as sim:
        proc = start_worker(redis_url, sim.url, "redo", log, concurrency=2)
        try:
            wait_for(lambda: client.hget(heartbeat_key("redo"), "consuming") == b"1", 60,
                     "the gate to open")
            # Line 1 restored by kombu: skipped. Line 2 a first delivery: generated.
            client.lpush(QUEUE, _message("redo", 1, redelivered=True),
                         _message("redo", 2, redelivered=False),
                         _message("redo", 3, redelivered=True))
            wait_for(lambda: client.llen(QUEUE) == 0 and client.hlen("unacked") == 0
                     and client.getbit(keys.done, 3) == 1, 60, "all three to be handled")
            wait_for(lambda: "already done" in log.read_text(), 30, "the skip's line")
        finally:
            stop(proc)
    lines = sorted(orjson.loads(fields[b"d"])["line"]
                   for _, fields in client.xrange(keys.stream))
    assert lines == [2, 3], lines
    assert log.read_text().count("already done") == 1
