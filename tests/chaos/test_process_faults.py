"""Kill and restart real processes mid-run: every row must still be written exactly once."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import redis

from fleetgen.base.contract import RunKeys
from fleetgen.base.redisconn import read_hash
from fleetgen.local.fleet import LocalFleet
from fleetgen.local.procs import wait_for
from tests.chaos.conftest import FleetFactory, generated
from tests.chaos.test_redis_loss import copy_data, restart_from
from tests.e2e.pipeline import assert_exactly_once, drain, make_prompts, produce, read_output

N = 300


def written(out: Path) -> int:
    path = out / "results.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def done_count(fleet: LocalFleet, run: str) -> int:
    return int(redis.Redis.from_url(fleet.redis_url).bitcount(RunKeys(run).done))


def start_producer(fleet: LocalFleet, prompts: Path, run: str) -> threading.Thread:
    thread = threading.Thread(target=produce, args=(fleet, prompts, run), daemon=True)
    thread.start()
    return thread


def fleetgen_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetgen", *args]


def test_worker_sigkill_mid_run_prompts_are_redelivered(make_fleet: FleetFactory,
                                                        tmp_path: Path) -> None:
    fleet = make_fleet(worker_env={"FLEETGEN_VISIBILITY_TIMEOUT_S": "6",
                                   "FLEETGEN_REQUEST_TIMEOUT_S": "4"})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N)
    start_producer(fleet, prompts, "kill9")
    wait_for(lambda: done_count(fleet, "kill9") >= N // 4, 60, "a quarter of the rows")
    client = redis.Redis.from_url(fleet.redis_url)
    held = client.hlen("unacked")
    fleet.workers[1].signal(signal.SIGKILL)
    assert held > 0, "nothing was in flight when the worker died: the test proves nothing"
    drain(fleet, "kill9", out, timeout_s=120)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == N and not data["failures"]
    assert client.hlen("unacked") == 0


def test_worker_sigterm_hands_prompts_back_at_once(make_fleet: FleetFactory,
                                                   tmp_path: Path) -> None:
    # A visibility timeout far longer than the test: only a clean hand-back can finish it.
    fleet = make_fleet(worker_env={"FLEETGEN_VISIBILITY_TIMEOUT_S": "3600"})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N)
    start_producer(fleet, prompts, "term")
    wait_for(lambda: done_count(fleet, "term") >= N // 4, 60, "a quarter of the rows")
    worker = fleet.workers[1]
    worker.signal(signal.SIGTERM)
    worker.proc.wait(timeout=60)
    drain(fleet, "term", out, timeout_s=90)
    assert_exactly_once(out, set(kinds["good"]))


def test_drainer_sigkilled_repeatedly_repairs_torn_lines(make_fleet: FleetFactory,
                                                         tmp_path: Path) -> None:
    fleet = make_fleet(max_running_requests=16, tpot_ms=0.3)
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 600)
    producer = start_producer(fleet, prompts, "drainkill")
    argv = fleetgen_cli("drain", "--run", "drainkill", "--out", str(out), "--batch", "16",
                        "--redis", fleet.redis_url)
    for round_no in range(4):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        target = written(out) + 40
        wait_for(lambda t=target, p=proc: written(out) >= t or p.poll() is not None, 60,
                 "the drainer to write more")
        proc.kill()
        proc.wait()
        if round_no == 1:  # what a kill in the middle of a write() leaves behind
            with (out / "results.jsonl").open("ab") as f:
                f.write(b'{"id": "torn", "completion": "half a li')
    producer.join(timeout=60)
    summary = drain(fleet, "drainkill", out, timeout_s=120)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert summary["done"] == 600 == len(data["results"])


def test_valkey_killed_and_restarted_mid_run(make_fleet: FleetFactory, tmp_path: Path) -> None:
    fleet = make_fleet()
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N)
    producer = subprocess.Popen(
        # A small high-water mark keeps the producer mid-enqueue when Redis goes away.
        fleetgen_cli("produce", str(prompts), "--run", "vk", "--context-length", "4096",
                     "--reconcile-interval", "2", "--high-water", "30", "--batch-size", "10",
                     "--redis", fleet.redis_url),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    drainer = subprocess.Popen(
        fleetgen_cli("drain", "--run", "vk", "--out", str(out), "--redis", fleet.redis_url),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for(lambda: written(out) >= N // 4, 90, "a quarter of the rows written")
    # Valkey comes back from a copy older than the moment it died (as after a crash that
    # lost unsynced writes, only more): rows queued since the copy are gone with it.
    copy = copy_data(fleet.valkey, tmp_path / "copy")
    wait_for(lambda: written(out) >= N // 2, 90, "half of the rows written")
    restart_from(fleet.valkey, copy)
    assert drainer.wait(timeout=150) == 0, drainer.stdout.read().decode() if drainer.stdout \
        else ""
    assert producer.wait(timeout=30) == 0
    report = producer.stdout.read().decode() if producer.stdout else ""
    requeued = re.search(r"(\d+) re-enqueued after loss", report)
    assert requeued and int(requeued.group(1)) > 0, report  # reconciliation really ran
    print(f"re-enqueued after the restore: {requeued.group(1)}")
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == N


def test_producer_killed_mid_enqueue_and_rerun(make_fleet: FleetFactory,
                                               tmp_path: Path) -> None:
    fleet = make_fleet()
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N, too_long=3, long_tokens=6000)
    argv = fleetgen_cli("produce", str(prompts), "--run", "pk", "--context-length", "4096",
                        "--high-water", "20", "--batch-size", "10", "--redis", fleet.redis_url)
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis.from_url(fleet.redis_url)
    wait_for(lambda: int(read_hash(client, RunKeys("pk").manifest).get("read", 0)) >= 100, 60,
             "the producer to read 100 rows")
    first.kill()
    first.wait()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    drain(fleet, "pk", out, timeout_s=120)
    data = assert_exactly_once(out, set(kinds["good"]) | set(kinds["too_long"]))
    # Nothing was generated twice: the simulators served exactly one completion per row.
    assert generated(fleet) == len(data["results"]) == N

    before = {p.name: p.read_bytes() for p in out.glob("*.jsonl")}
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0 and "already complete" in rerun.stdout
    drain(fleet, "pk", out, timeout_s=30)
    assert {p.name: p.read_bytes() for p in out.glob("*.jsonl")} == before
    assert generated(fleet) == N
    assert read_output(out)["rejected"][0]["reason"].startswith("prompt_too_long")
