"""A worker started without -c sizes its pool from the running requests the engine has in
force, paces its in-flight limit from the queue of an engine that reports none (vLLM), waits for
an engine that is still loading, and refuses one it cannot use."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleetgen import exitcodes
from fleetgen.local.ports import lease_port
from fleetgen.runstate.keys import RunKeys
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import SimThread, run_in_thread
from producer.enqueue import Enqueuer
from tests.support.tasks import payloads
from tests.support.waiting import wait_until
from tests.support.workers import assert_one_line_exit, heartbeat_key, start_worker, stop
from workers.pacing import START_LIMIT, held_queue

# Starts real Celery worker processes: the fleet tier (tests/conftest.py).
pytestmark = pytest.mark.fleet


@pytest.fixture()
def sim() -> Iterator[SimThread]:
    with run_in_thread(SimConfig(port=0, max_running_requests=5)) as handle:
        yield handle


def test_pool_is_slots_plus_one_without_c(redis_url: str, sim: SimThread,
                                          tmp_path: Path) -> None:
    proc = start_worker(redis_url, sim.url, "auto", tmp_path / "w.log")
    try:
        client = redis.Redis.from_url(redis_url)
        key = heartbeat_key("auto")
        wait_until(lambda: client.exists(key) == 1, 60, "the worker's heartbeat")
        assert client.hget(key, "concurrency") == b"6"
    finally:
        stop(proc)


def test_pool_follows_the_derived_limit_when_top_level_is_null(redis_url: str,
                                                               tmp_path: Path) -> None:
    # SGLang's usual case: no --max-running-requests, so /server_info's top-level value is
    # null and the limit in force is only in internal_states.
    log = tmp_path / "w.log"
    with run_in_thread(SimConfig(port=0, derived_slots=7, health_delay_s=0)) as server:
        proc = start_worker(redis_url, server.url, "derived", log)
        try:
            client = redis.Redis.from_url(redis_url)
            key = heartbeat_key("derived")
            wait_until(lambda: client.exists(key) == 1, 60, "the worker's heartbeat")
            assert client.hget(key, "concurrency") == b"8"
        finally:
            stop(proc)
    assert "in-flight limit 8: sglang reports 7 running requests (internal_states): K + 1 = 8" \
        in log.read_text()


def test_worker_paces_from_the_queue_of_an_engine_that_reports_no_slots(
        redis_url: str, tmp_path: Path) -> None:
    """The vLLM flavour says nothing of its 24 slots, as vLLM does not: the worker finds them
    from its queue gauges, holds every slot busy with a small queue, and says where its limit
    comes from. Before, it kept Celery's default pool (one thread per host core: 2 here)."""
    log = tmp_path / "w.log"
    slots, n = 24, 240
    config = SimConfig(port=0, flavor="vllm", max_running_requests=slots, ttft_ms=5,
                       tpot_ms=25, health_delay_s=0)
    with run_in_thread(config) as server:
        proc = start_worker(redis_url, server.url, "paced", log)
        client = redis.Redis.from_url(redis_url)
        key, keys = heartbeat_key("paced"), RunKeys("paced")
        seen: list[dict[bytes, bytes]] = []
        try:
            wait_until(lambda: client.exists(key) == 1, 60, "the worker's heartbeat")
            assert b"found from its queue" in (client.hget(key, "limit_from") or b"")
            client.hset(keys.manifest, "state", "producing")  # workers drop unknown runs
            Enqueuer(client, "paced").send(payloads("paced", n, max_tokens=32))

            def finished() -> bool:
                seen.append(client.hgetall(key))
                return int(client.hget(keys.stats, "done") or 0) >= n
            wait_until(finished, 120, "every prompt to be answered", poll_s=0.2)
        finally:
            stop(proc)
    full = [b for b in seen if int(b.get(b"engine_running", b"0")) == slots]
    assert full, "the engine's slots were never all busy"
    limits = [int(b[b"concurrency"]) for b in seen if b"concurrency" in b]
    assert max(limits) >= slots + held_queue(slots), limits
    held = [int(b[b"engine_waiting"]) for b in full]
    # Once settled the queue stays small: the median reading, not the first overshoot.
    assert sorted(held)[len(held) // 2] <= 2 * held_queue(slots), held
    assert f"in-flight limit {START_LIMIT}: vllm reports no slot count: found from its queue" \
        in log.read_text()


def test_worker_waits_for_a_loading_engine_then_sizes_from_it(redis_url: str,
                                                             tmp_path: Path) -> None:
    lease = lease_port()  # the worker must know the URL before the server exists
    log = tmp_path / "w.log"
    proc = start_worker(redis_url, f"http://127.0.0.1:{lease.port}", "late", log)
    client = redis.Redis.from_url(redis_url)
    key = heartbeat_key("late")
    try:
        wait_until(lambda: "waiting for engine" in log.read_text(), 60,
                   "the worker to say it waits for its engine")
        assert proc.poll() is None and not client.exists(key)  # waiting, not started
        with run_in_thread(SimConfig(port=lease.port, derived_slots=3, health_delay_s=0)):
            wait_until(lambda: client.exists(key) == 1, 60, "the worker's heartbeat")
            assert client.hget(key, "concurrency") == b"4"
    finally:
        stop(proc)
        lease.close()


def test_worker_gives_up_on_an_engine_that_never_comes(redis_url: str, tmp_path: Path) -> None:
    lease = lease_port()
    log = tmp_path / "w.log"
    proc = start_worker(redis_url, f"http://127.0.0.1:{lease.port}", "never", log,
                        env={"FLEETGEN_ENGINE_WAIT_S": "1"})
    try:
        code = proc.wait(timeout=60)
    finally:
        stop(proc)
        lease.close()
    assert_one_line_exit(log, code, exitcodes.UNAVAILABLE, "FLEETGEN_ENGINE_WAIT_S")


@pytest.mark.parametrize("concurrency", [None, 2])
def test_worker_refuses_a_server_without_text_output(redis_url: str, tmp_path: Path,
                                                     concurrency: int | None) -> None:
    log = tmp_path / "w.log"
    config = SimConfig(port=0, skip_tokenizer_init=True, health_delay_s=0)
    with run_in_thread(config) as server:
        proc = start_worker(redis_url, server.url, "notext", log, concurrency=concurrency)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop(proc)
    assert_one_line_exit(log, code, exitcodes.CONFIG, "skip-tokenizer-init")
