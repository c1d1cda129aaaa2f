"""Celery's per-task INFO lines (received, succeeded) are off at `-l INFO` unless
FLEETGEN_TASK_LOG=1: at hundreds of prompts a second they cost a worker a fifth of its CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleetgen.queue.contract import QUEUE, TaskPayload
from fleetgen.queue.wire import task_message
from fleetgen.runstate.keys import RunKeys
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import SimThread, run_in_thread
from tests.support.waiting import wait_until
from tests.support.workers import start_worker, stop

# Starts real Celery worker processes: the fleet tier (tests/conftest.py).
pytestmark = pytest.mark.fleet


@pytest.fixture()
def sim() -> Iterator[SimThread]:
    with run_in_thread(SimConfig(port=0, max_running_requests=2, ttft_ms=0, tpot_ms=0)) as s:
        yield s


@pytest.mark.parametrize(("task_log", "lines"), [("0", 0), ("1", 3)])
def test_task_lines_only_when_asked(redis_url: str, sim: SimThread, tmp_path: Path,
                                    task_log: str, lines: int) -> None:
    client = redis.Redis.from_url(redis_url)
    client.hset(RunKeys("log").manifest, "state", "producing")  # a run the worker knows
    client.lpush(QUEUE, *[task_message(TaskPayload(
        run="log", line=i, id=f"x{i}", input_ids=[5, 6, 7], max_tokens=8, sampling={}, row={}))
        for i in (1, 2, 3)])
    log = tmp_path / "w.log"
    proc = start_worker(redis_url, sim.url, "log", log, concurrency=2,
                        env={"FLEETGEN_TASK_LOG": task_log})
    try:
        wait_until(lambda: int(client.hget(RunKeys("log").stats, "done") or 0) == 3, 60,
                   "three outcomes")
    finally:
        stop(proc)  # the log is complete once the worker has exited
    text = log.read_text()
    assert (text.count("] received"), text.count("] succeeded in")) == (lines, lines)
