"""`fleetgen purge --run R --force` on an unfinished run (issue 22, point 1): its tasks leave the
queue and kombu's unacked hash with its keys, and a worker that still meets one of them (a
prompt it was running at the purge) writes nothing back: the run is gone for good."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from fleetgen.queue.contract import QUEUE, TaskPayload
from fleetgen.queue.wire import KOMBU_UNACKED, slots_in_flight, task_message
from fleetgen.runstate.keys import RunKeys
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import SimThread, run_in_thread
from tests.support.waiting import wait_until
from tests.support.workers import start_worker, stop


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=240, env=dict(os.environ))


def enqueue(redis_url: str, tmp_path: Path, run: str, rows: int) -> None:
    prompts = tmp_path / f"{run}.jsonl"
    prompts.write_text("".join(f'{{"id": "{run}{i}", "prompt": "question {i}"}}\n'
                               for i in range(rows)))
    done = cli("produce", str(prompts), "--run", run, "--context-length", "4096",
               "--no-wait", "--redis", redis_url)
    assert done.returncode == 0, done.stderr


def run_keys(client: redis.Redis, run: str) -> list[bytes]:
    return list(client.scan_iter(match=f"fleetgen:run:{run}:*"))


def generated(sim: SimThread) -> int:
    with httpx.Client(base_url=sim.url) as http:
        return sum(http.get("/_sim/stats").json()["requests_total"].values())


@pytest.fixture()
def fast_sim() -> Iterator[SimThread]:
    with run_in_thread(SimConfig(port=0, ttft_ms=0, tpot_ms=0, health_delay_s=0,
                                 output_tokens_mean=8)) as sim:
        yield sim


def test_purge_removes_queued_tasks_a_later_worker_would_run(
        redis_url: str, tmp_path: Path, fast_sim: SimThread) -> None:
    client = redis.Redis.from_url(redis_url)
    enqueue(redis_url, tmp_path, "gone", 40)
    enqueue(redis_url, tmp_path, "kept", 5)  # behind the purged run's tasks in the queue
    assert client.llen(QUEUE) == 45

    purged = cli("purge", "--run", "gone", "--force", "--redis", redis_url)
    assert purged.returncode == 0, purged.stderr
    assert "40 queued and 0 unacked task(s) removed" in purged.stdout, purged.stdout
    assert slots_in_flight(client, "gone") == set() and client.llen(QUEUE) == 5

    proc = start_worker(redis_url, fast_sim.url, "late", tmp_path / "w.log", concurrency=2)
    try:
        wait_until(lambda: client.bitcount(RunKeys("kept").done) == 5, 60, "the kept run")
    finally:
        stop(proc)
    assert generated(fast_sim) == 5, "the purged run's prompts were generated"
    assert run_keys(client, "gone") == []
    status = cli("status", "--run", "gone", "--redis", redis_url)
    assert status.returncode == 3 and "no run named 'gone'" in status.stderr


def test_purge_removes_unacked_tasks_and_the_worker_drops_what_it_held(
        redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    enqueue(redis_url, tmp_path, "held", 40)
    log = tmp_path / "w.log"
    # Answers that take 3 s: the worker certainly holds its 4 prompts at the purge.
    with run_in_thread(SimConfig(port=0, ttft_ms=3000, tpot_ms=0, health_delay_s=0,
                                 output_tokens_mean=8)) as sim:
        proc = start_worker(redis_url, sim.url, "holder", log, concurrency=4)
        try:
            wait_until(lambda: client.hlen(KOMBU_UNACKED) == 4, 60, "4 prompts held unacked")
            purged = cli("purge", "--run", "held", "--force", "--redis", redis_url)
            assert purged.returncode == 0, purged.stderr
            assert "36 queued and 4 unacked task(s) removed" in purged.stdout, purged.stdout
            assert client.llen(QUEUE) == 0 and client.hlen(KOMBU_UNACKED) == 0
            assert client.zcard("unacked_index") == 0
            # The 4 prompts it was running finish; their outcomes are dropped, and logged.
            wait_until(lambda: log.read_text().count("dropped: run 'held' has no manifest") == 4,
                     60, "the worker to drop the 4 outcomes")
        finally:
            stop(proc)
    assert "4 task(s) of it dropped by this worker" in log.read_text()
    assert run_keys(client, "held") == [], "the purged run's keys came back"


def test_a_task_of_a_run_without_a_manifest_is_dropped_not_generated(
        redis_url: str, tmp_path: Path, fast_sim: SimThread) -> None:
    """A task that escaped a purge (pushed back by a worker's hand-back meanwhile, say): the
    worker drops it before calling the engine, and counts it in its log."""
    client = redis.Redis.from_url(redis_url)
    client.lpush(QUEUE, *[task_message(TaskPayload(
        run="stray", line=i, id=f"s{i}", input_ids=[5, 6, 7], max_tokens=8, sampling={}, row={}))
        for i in (1, 2, 3)])
    enqueue(redis_url, tmp_path, "known", 2)  # behind the strays: done means they were seen
    log = tmp_path / "w.log"
    proc = start_worker(redis_url, fast_sim.url, "strays", log, concurrency=1)
    try:
        wait_until(lambda: client.bitcount(RunKeys("known").done) == 2, 60, "the known run")
    finally:
        stop(proc)
    assert generated(fast_sim) == 2
    assert "id=s3 dropped: run 'stray' has no manifest" in log.read_text()
    assert "3 task(s) of it dropped by this worker" in log.read_text()
    assert run_keys(client, "stray") == []
