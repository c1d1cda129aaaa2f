"""A whole run through a real SGLang router (`sglang-router`, the Rust gateway from PyPI) in
front of two simulated SGLang servers: the limits are read from the servers it lists, health
from its /readiness, and a worker without -c paces from the servers' queues."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from fleetgen import engine, exitcodes
from fleetgen.cli import main as cli
from fleetgen.engine.health import probe_url
from fleetgen.local.ports import lease_port
from fleetgen.simulator import SimConfig, SimThread, run_in_thread
from tests.support.content import assert_content
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.waiting import wait_until
from tests.support.workers import heartbeat_key, start_worker, stop

pytest.importorskip("sglang_router", reason="pip install sglang-router (make test installs it)")

SLOTS = 4


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimThread]]:
    # Thinking, as Qwen3.6 (whose template the prompts are rendered with) is served.
    started = [run_in_thread(SimConfig(port=0, context_length=ctx, derived_slots=SLOTS,
                                       ttft_ms=1, tpot_ms=0.01, health_delay_s=0,
                                       thinking=True))
               for ctx in (4096, 8192)]
    yield started
    for sim in started:
        sim.stop()


@pytest.fixture(scope="module")
def router(sims: list[SimThread], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    lease, metrics = lease_port(), lease_port()
    log = tmp_path_factory.mktemp("router") / "router.log"
    # Its Prometheus server binds 0.0.0.0:29000 unless told: a leased port, or the router
    # panics whenever anything else on the machine holds 29000 (1 run in 4 beside llama.cpp's).
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
         "--port", str(lease.port), "--prometheus-host", "127.0.0.1",
         "--prometheus-port", str(metrics.port), "--policy", "cache_aware", "--worker-urls",
         *(sim.url for sim in sims)], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{lease.port}"
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"router exited: {log.read_text()[:2000]}")
            return probe_url(url).ready
        wait_until(up, 60, "the router's /readiness")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        lease.close()
        metrics.close()


def test_the_router_is_read_through_the_servers_it_lists(router: str) -> None:
    proto = engine.resolve(None, router)
    assert proto.name == "sglang"
    limits = proto.read_limits(router)
    # Its own /v1/models has no max_model_len and /get_server_info describes the router.
    assert httpx.get(f"{router}/get_server_info").json().get("router_manager") is True
    assert (limits.context_length, limits.servers_behind) == (4096, 2)  # the smallest wins
    assert limits.max_running_requests == 2 * SLOTS
    assert proto.pool_size(limits) is None


def test_a_run_through_the_router(router: str, sims: list[SimThread], redis_url: str,
                                  tmp_path: Path) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 60, too_long=1, long_tokens=5000)
    worker = start_worker(redis_url, router, "via-router", tmp_path / "w.log", concurrency=9)
    codes: list[int] = []
    producer = threading.Thread(target=lambda: codes.append(cli.main(
        ["produce", str(prompts), "--run", "router", "--redis", redis_url, "--engine-url",
         router, "--no-wait"])))
    producer.start()
    try:
        drained = cli.main(["drain", "--run", "router", "--out", str(out), "--redis", redis_url])
        producer.join(timeout=60)
    finally:
        stop(worker)
    assert codes == [exitcodes.OK] and drained == exitcodes.OK
    data = assert_exactly_once(out, set(kinds["good"]) | set(kinds["too_long"]))
    assert not data["failures"] and len(data["rejected"]) == 1
    for r in data["results"]:  # SGLang's rule on the smallest context behind the router
        assert r["max_tokens"] == 4096 - r["prompt_tokens"] - 2 and r["attempts"] == 1
    served = [httpx.get(f"{sim.url}/_sim/stats").json()["generation_tokens_total"]
              for sim in sims]
    assert all(n > 0 for n in served), served  # the router spread the work
    config = SimConfig(port=0, context_length=4096, derived_slots=SLOTS, thinking=True)
    assert assert_content(data["results"], prompts, config) == 60


def test_a_worker_without_c_paces_from_the_queues_behind_the_router(
        router: str, redis_url: str, tmp_path: Path) -> None:
    """How many workers share the servers is not the router's to say, but their queues are:
    the worker reads the gauges of every server the router lists (it refused to start without
    -c before)."""
    log = tmp_path / "w.log"
    proc = start_worker(redis_url, router, "no-c", log)
    client = redis.Redis.from_url(redis_url)
    key = heartbeat_key("no-c")
    try:
        wait_until(lambda: client.exists(key) == 1, 60, "the worker's heartbeat",
                   check=lambda: _alive(proc, log))
        source = (client.hget(key, "limit_from") or b"").decode()
        assert "SGLang router in front of 2 server(s): found from their queues" in source
        assert client.hget(key, "paced") == b"1"
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()


def _alive(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"the worker exited {proc.returncode}: {log.read_text()[-2000:]}")


def test_doctor_understands_a_router(router: str, sims: list[SimThread],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["doctor", "--engine-url", router])
    output = capsys.readouterr().out
    # Through the router a probe reaches whichever server it picks: each is examined alone,
    # and the two contexts are told apart (the fleet's smallest, 4096, is what is budgeted).
    assert "is an SGLang router; examining the 2 server(s) behind it" in output
    assert all(sim.url in output for sim in sims), output
    assert "the producer budgets for: context 4096" in output
    assert code == 1 and "servers' context: they disagree" in output, output
