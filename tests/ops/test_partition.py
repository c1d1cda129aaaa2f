"""Network partitions between hosts (issue 52): a Valkey host (with the producer and the
drainer) and two worker hosts (a simulator and a worker each) as network namespaces on a bridge,
a cut being a host's switch port set down with permanent neighbour entries: a silent blackhole
(tests/support/netns.py). Each test proves its fault landed (the worker held prompts at the
cut, or Valkey answered a take into the cut), then that every row is written once, how long
the run took after the heal, and the GPU work against the rows.

Short leases so a cut longer than the lease fits in a test and the module stays near 4 minutes
on two cores: a 6 s lease (60 s by default), a beat every 0.5 s (2 s; a worker is lost after
1.5 s), hence a sweep every second; the hand-back must stay below the lease.
The figures of one run are printed (`pytest -s`) and recorded in docs/faults.md."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from fleetgen.local.procs import Child, ProcessGroup
from fleetgen.queue.contract import QUEUE, worker_key
from fleetgen.queue.wire import LEASES
from tests.support.netns import VALKEY, Hosts, hosts_on_a_bridge
from tests.support.ops import VENV_BIN, venv_env
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.waiting import wait_until

NODES = ("node-a", "node-b")
A, B = NODES
LEASE_S = 6.0
WORKER_ENV = {"FLEETGEN_VISIBILITY_TIMEOUT_S": str(LEASE_S), "FLEETGEN_HEALTH_INTERVAL_S": "0.5",
              "FLEETGEN_HANDBACK_S": "3"}
FLEETGEN = str(VENV_BIN / "fleetgen")


def _worker(node: str) -> str:
    return f"gpu0@{node}"


class Fleet:
    """Valkey on its host, a simulator and a worker per node host, the commands run on the
    Valkey host as an operator there would; the test reads Valkey through its own port."""

    def __init__(self, hosts: Hosts, tmp_path: Path) -> None:
        self.hosts, self.tmp = hosts, tmp_path
        self.procs = ProcessGroup(tmp_path / "logs")
        password = secrets.token_urlsafe(12)
        self.url = f"redis://:{password}@{hosts.valkey_address}:6379/0"
        self.env = venv_env(FLEETGEN_REDIS_URL=self.url)
        self.procs.start("valkey", hosts.argv(VALKEY, [
            FLEETGEN, "valkey", "--dir", str(tmp_path / "valkey"), "--bind",
            hosts.valkey_address, "--port", "6379"]), env=self.env)
        self.redis = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)
        wait_until(self._pings, 30, "Valkey on its host", poll_s=0.2)
        self.workers: dict[str, Child] = {}

    def _pings(self) -> bool:
        try:
            return bool(self.redis.ping())
        except redis.RedisError:
            return False

    def start_sim(self, node: str, *, ttft_ms: int, slots: int) -> None:
        self.procs.start(f"sim-{node}", self.hosts.argv(node, [
            FLEETGEN, "sim", "--host", "127.0.0.1", "--port", "30000", "--context-length",
            "4096", "--max-running-requests", str(slots), "--ttft-ms", str(ttft_ms),
            "--tpot-ms", "1", "--output-tokens-mean", "20"]), env=self.env)

    def start_worker(self, node: str, concurrency: int) -> None:
        self.workers[node] = self.procs.start(f"worker-{node}", self.hosts.argv(node, [
            str(VENV_BIN / "celery"), "-A", "workers", "worker", "-Q", QUEUE, "-n",
            _worker(node), "-P", "threads", "-c", str(concurrency), "-l", "WARNING"]),
            env={**self.env, **WORKER_ENV, "FLEETGEN_ENGINE_URL": "http://127.0.0.1:30000"})

    def start_workers(self, concurrency: dict[str, int]) -> None:
        """Started together (each imports Celery for seconds), then each seen beating."""
        for node, slots in concurrency.items():
            self.start_worker(node, slots)
        for node in concurrency:
            self.fleetgen("check", "--wait-s", "60", "--worker", _worker(node))

    def fleetgen(self, *args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.hosts.argv(VALKEY, [FLEETGEN, *args]), env=self.env,
                                capture_output=True, text=True, timeout=timeout_s)
        assert result.returncode == 0, (f"fleetgen {args[0]}: {result.stdout}{result.stderr}"
                                        + self.logs())
        return result

    def start(self, name: str, *args: str) -> Child:
        return self.procs.start(name, self.hosts.argv(VALKEY, [FLEETGEN, *args]), env=self.env)

    def produce(self, run: str, rows: int, *extra: str) -> tuple[Path, set[str]]:
        prompts = self.tmp / f"{run}.jsonl"
        ids = set(make_prompts(prompts, rows, seed=52)["good"])
        self.fleetgen("produce", str(prompts), "--run", run, "--context-length", "4096",
                      "--max-output-tokens", "64", "--no-wait", *extra)
        return prompts, ids

    def held(self, node: str) -> int:
        held = self.redis.hget(worker_key(_worker(node)), "held")
        return int(held or 0)

    def steady_held(self, node: str, at_least: int, timeout_s: float = 60) -> int:
        """What `node`'s worker holds once it holds `at_least` and its heartbeat has said the
        same for three beats: the number of prompts it holds at a cut made now. A reading
        taken as soon as it reached `at_least` undercounted a worker still taking (its takes
        follow one another, each after the last one's record)."""
        readings: list[int] = []

        def steady() -> int:
            readings.append(self.held(node))
            time.sleep(0.25)
            last = readings[-6:]
            return last[0] if len(last) == 6 and last[0] >= at_least and \
                len(set(last)) == 1 else 0

        return wait_until(steady, timeout_s, f"{_worker(node)} to hold {at_least}+ steadily",
                          poll_s=0)

    def _stats(self, node: str) -> dict[str, Any]:
        out = subprocess.run(self.hosts.argv(node, [
            str(VENV_BIN / "python"), "-c",
            "import httpx; print(httpx.get('http://127.0.0.1:30000/_sim/stats').text)"]),
            capture_output=True, text=True, timeout=30, check=True).stdout
        stats: dict[str, Any] = json.loads(out)
        return stats

    def gpu_work(self) -> int:
        """Completions the simulators answered (HTTP 200), once none runs any more: a
        generation a lapsed lease repeated may still run when the run is complete."""
        def settled() -> bool:
            return all(self._stats(n)["num_running_reqs"] + self._stats(n)["num_queue_reqs"]
                       == 0 for n in NODES)

        wait_until(settled, 60, "the simulators to finish what they run", poll_s=0.5)
        return sum(int(self._stats(n)["requests_total"].get("200", 0)) for n in NODES)

    def logs(self) -> str:
        return "\n" + "\n".join(f"--- {c.name}\n{c.log_text()[-2500:]}"
                                for c in self.procs.children)

    def wait_exit(self, child: Child, timeout_s: float) -> None:
        wait_until(lambda: not child.alive(), timeout_s, f"{child.name} to finish",
                   poll_s=0.2, check=lambda: None)
        assert child.proc.returncode == 0, f"{child.name} exited {child.proc.returncode}" + \
            self.logs()


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command is missing")
    try:
        bridge = hosts_on_a_bridge(NODES)
        hosts = bridge.__enter__()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces not permitted: {exc.stderr.strip()}")
    fleet = None
    try:
        fleet = Fleet(hosts, tmp_path)
        yield fleet
    finally:
        for node in NODES:
            hosts.heal(node)  # the processes stop through their links, not by timeouts
        if fleet is not None:
            fleet.procs.stop_all(grace_s=10)
        bridge.__exit__(None, None, None)


def _figures(case: str, **figures: object) -> None:
    print(f"\n[partition] {case}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def test_a_worker_host_cut_shorter_than_its_lease_loses_nothing_and_repeats_nothing(
        fleet: Fleet, tmp_path: Path) -> None:
    """A 3 s cut of a worker holding prompts (lease 6 s): its leases hold, nothing is
    redelivered, and its log says it lost Valkey and had it back (point 4)."""
    fleet.start_sim(A, ttft_ms=5000, slots=8)
    fleet.start_sim(B, ttft_ms=200, slots=8)
    fleet.start_workers({A: 8, B: 8})
    _, ids = fleet.produce("short", 40)
    drain = fleet.start("drain", "drain", "--run", "short", "--out", str(tmp_path / "out"))
    held = fleet.steady_held(A, 4)
    fleet.hosts.cut(A)
    time.sleep(3)
    fleet.hosts.heal(A)
    healed = time.monotonic()
    fleet.wait_exit(drain, 90)
    after_s = time.monotonic() - healed
    assert_exactly_once(tmp_path / "out", ids)
    served = fleet.gpu_work()
    log = fleet.workers[A].log_text()
    _figures("worker host cut 3 s < lease 6 s", rows=len(ids), held_at_cut=held,
             complete_after_heal_s=round(after_s, 1), gpu_work=served, extra=served - len(ids))
    assert served == len(ids), "a prompt was generated twice though no lease lapsed"
    assert "Valkey lost: no heartbeat has reached it" in log, log[-3000:]
    assert "Valkey back after" in log and "its lease held" in log, log[-3000:]
    assert "late ack" not in log


def test_a_late_ack_after_a_cut_longer_than_the_lease_leaves_the_other_workers_copy(
        fleet: Fleet, tmp_path: Path) -> None:
    """Point 2: gpu0@node-a is cut for 9 s (lease 6 s) holding prompts of 12 s; gpu0@node-b
    takes them again after the lease (its own 12 s each); node-a's answers, after the heal,
    are written first and acknowledged while node-b still holds the same messages. Its acks
    are refused (one script) and node-b's copies stay; before, they removed them."""
    fleet.start_sim(A, ttft_ms=12_000, slots=8)
    fleet.start_sim(B, ttft_ms=12_000, slots=16)
    fleet.start_workers({A: 8, B: 16})
    _, ids = fleet.produce("late", 16)
    drain = fleet.start("drain", "drain", "--run", "late", "--out", str(tmp_path / "out"))
    held = fleet.steady_held(A, 2)
    fleet.hosts.cut(A)
    time.sleep(LEASE_S + 3)
    fleet.hosts.heal(A)
    healed = time.monotonic()
    worker_a = fleet.workers[A]

    def late_acks() -> list[str]:
        return re.findall(r"late ack of message (\S+) left alone", worker_a.log_text())

    tags = wait_until(lambda: late_acks() if len(late_acks()) >= held else [], 40,
                      "gpu0@node-a's late acks")
    # node-b took them again and holds them still (its 12 s generations run): its copies.
    kept = [t for t in tags if fleet.redis.hexists("unacked", t)]
    fleet.wait_exit(drain, 90)
    after_s = time.monotonic() - healed
    data = assert_exactly_once(tmp_path / "out", ids)
    served = fleet.gpu_work()
    _figures("worker host cut 9 s > lease 6 s, late acks", rows=len(ids), held_at_cut=held,
             late_acks=len(tags), copies_kept=len(kept),
             complete_after_heal_s=round(after_s, 1), gpu_work=served, extra=served - len(ids))
    assert kept == tags, "a late ack removed the copy of the worker that had re-taken it"
    assert served == len(ids) + held  # exactly the prompts held past the lease, again
    assert "its lease lapsed meanwhile" in worker_a.log_text()
    assert {r["worker"] for r in data["results"]} == {_worker(A), _worker(B)}


def test_the_valkey_host_cut_off_from_every_worker(fleet: Fleet, tmp_path: Path) -> None:
    """Both workers lose Valkey for 9 s (past the 6 s lease) while holding prompts. Meanwhile
    `status` names both lost and never says their prompts come back "at the next sweep" (no
    worker can sweep), and the drainer's terminal names each lost worker (point 4)."""
    fleet.start_sim(A, ttft_ms=2000, slots=8)
    fleet.start_sim(B, ttft_ms=2000, slots=8)
    fleet.start_workers({A: 8, B: 8})
    _, ids = fleet.produce("vcut", 48)
    drain = fleet.start("drain", "drain", "--run", "vcut", "--out", str(tmp_path / "out"))
    results = tmp_path / "out" / "results.jsonl"
    # The drainer says what it saw change: it must have seen both workers answer (it looks at
    # each row it writes), or a slow start on a loaded machine finds them already lost.
    wait_until(lambda: results.exists() and results.stat().st_size > 0
               and fleet.held(A) >= 2 and fleet.held(B) >= 2, 60, "a row written, both holding")
    held = fleet.held(A) + fleet.held(B)
    fleet.hosts.cut(A, B)
    cut = time.monotonic()
    wait_until(lambda: "held by lost worker" in fleet.fleetgen(
        "status", "--run", "vcut").stdout, 20, "status to see the lost workers", poll_s=1)
    status = fleet.fleetgen("status", "--run", "vcut").stdout
    time.sleep(max(LEASE_S + 3 - (time.monotonic() - cut), 0))
    fleet.hosts.heal(A, B)
    healed = time.monotonic()
    fleet.wait_exit(drain, 120)
    after_s = time.monotonic() - healed
    assert_exactly_once(tmp_path / "out", ids)
    served = fleet.gpu_work()
    _figures("Valkey host cut 9 s > lease 6 s", rows=len(ids), held_at_cut=held,
             complete_after_heal_s=round(after_s, 1), gpu_work=served, extra=served - len(ids))
    assert "next sweep" not in status and "only once a worker reaches Valkey again" in status, \
        status
    lost = [line for line in drain.log_text().splitlines() if " LOST at " in line]
    for node in NODES:  # both engines are http://127.0.0.1:30000, each on its own host
        assert any(_worker(node) in line for line in lost), drain.log_text()
    assert all("next sweep" not in line for line in lost), lost
    assert served <= len(ids) + held


def test_a_worker_host_never_healed(fleet: Fleet, tmp_path: Path) -> None:
    """gpu0@node-b is cut for good holding prompts: they come back after its lease and the
    run completes on node-a; node-b's answers, generated in the cut, never arrive."""
    fleet.start_sim(A, ttft_ms=300, slots=8)
    fleet.start_sim(B, ttft_ms=3000, slots=8)
    fleet.start_workers({A: 8, B: 8})
    _, ids = fleet.produce("never", 40)
    drain = fleet.start("drain", "drain", "--run", "never", "--out", str(tmp_path / "out"))
    held = fleet.steady_held(B, 2)
    fleet.hosts.cut(B)
    cut = time.monotonic()
    fleet.wait_exit(drain, 90)
    after_s = time.monotonic() - cut
    assert_exactly_once(tmp_path / "out", ids)
    served = fleet.gpu_work()
    _figures("worker host cut for good", rows=len(ids), held_at_cut=held,
             complete_after_cut_s=round(after_s, 1), gpu_work=served, extra=served - len(ids))
    assert fleet.hosts.is_cut(B)
    assert served <= len(ids) + held
    assert after_s < LEASE_S + 30


def _blocked_take(fleet: Fleet, node: str) -> bool:
    """Whether the node's worker waits in its blocking take (an idle worker)."""
    address = f"{fleet.hosts.subnet}.{NODES.index(node) + 2}:"
    return any(c.get("cmd") == "blmove" and "b" in str(c.get("flags", ""))
               and str(c.get("addr", "")).startswith(address)
               for c in fleet.redis.client_list())


def test_a_message_answered_into_a_cut_is_not_lost_without_a_waiting_producer(
        fleet: Fleet, tmp_path: Path) -> None:
    """Point 1: an idle worker waits in its take; its host is cut and a message arrives that
    very moment: Valkey hands it over into the cut. The producer ran with --no-wait and is gone.
    The message is in the worker's taking list, so once its lease lapses another worker's
    sweep puts it back and it is written once; with kombu's BRPOP it was gone for good."""
    fleet.start_sim(A, ttft_ms=100, slots=8)
    fleet.start_sim(B, ttft_ms=100, slots=8)
    _, ids = fleet.produce("idle", 12)  # no worker yet: every message waits in the queue
    park = "h52:park"  # the test holds them back, to hand one over at the cut
    while fleet.redis.lmove(QUEUE, park, "RIGHT", "LEFT") is not None:
        pass
    assert fleet.redis.llen(park) == len(ids)
    drain = fleet.start("drain", "drain", "--run", "idle", "--out", str(tmp_path / "out"))
    fleet.start_workers({A: 4})
    for _ in range(10):  # the take blocks for 1 s at a time: land the message in that second
        wait_until(lambda: _blocked_take(fleet, A), 30, "gpu0@node-a to wait in its take",
                   poll_s=0.01)
        fleet.hosts.cut(A)
        fleet.redis.lmove(park, QUEUE, "RIGHT", "RIGHT")
        time.sleep(0.5)
        if fleet.redis.llen(QUEUE) == 0:
            break
        fleet.redis.lmove(QUEUE, park, "RIGHT", "RIGHT")  # the take had timed out: again
        fleet.hosts.heal(A)
    taken = [k for k in fleet.redis.scan_iter("fleetgen:taking:*") if fleet.redis.llen(k)]
    assert fleet.redis.llen(QUEUE) == 0 and len(taken) == 1, "no take was answered into a cut"
    cut = time.monotonic()
    while fleet.redis.lmove(park, QUEUE, "RIGHT", "RIGHT") is not None:
        pass
    fleet.start_workers({B: 4})
    fleet.wait_exit(drain, 90)
    after_s = time.monotonic() - cut
    data = assert_exactly_once(tmp_path / "out", ids)
    served = fleet.gpu_work()
    _figures("message answered into a cut, --no-wait", rows=len(ids),
             complete_after_cut_s=round(after_s, 1), gpu_work=served, extra=served - len(ids))
    assert fleet.hosts.is_cut(A)
    assert {r["worker"] for r in data["results"]} == {_worker(B)}
    assert served == len(ids)
    assert fleet.redis.llen(taken[0]) == 0
    assert fleet.redis.zscore(LEASES, taken[0].decode().rsplit(":", 1)[1]) is None
