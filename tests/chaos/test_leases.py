"""A worker's hold on a prompt is a lease its heartbeat renews (fleetgen/queue/broker.py
`QoS.beat`), at the defaults a user gets (FLEETGEN_VISIBILITY_TIMEOUT_S 60 s, heartbeat every
2 s): a generation that outlasts the lease is never redelivered while its worker lives, and a
worker frozen past its lease loses its prompts to the others and, woken, writes none of them a
second time. The SIGKILLed worker: tests/chaos/test_process_faults.py."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import redis

from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import RunKeys
from fleetgen.settings.envvars import HEALTH_INTERVAL_S, VISIBILITY_TIMEOUT_S
from tests.support import held
from tests.support.content import assert_fleet_content
from tests.support.fleet import FleetFactory, sim_stats
from tests.support.held import worker_name
from tests.support.pipeline import assert_exactly_once, drain, make_prompts, produce
from tests.support.waiting import wait_until

LEASE_S = VISIBILITY_TIMEOUT_S.default
# Local fleets beat every 1 s (fleetgen/local/fleet.py); these tests beat as users' workers do.
DEFAULT_LEASE = {HEALTH_INTERVAL_S.name: str(HEALTH_INTERVAL_S.default)}


def served(fleet_stats: dict[str, object]) -> int:
    return int(fleet_stats["requests_total"].get("200", 0))  # type: ignore[attr-defined]


def test_a_generation_longer_than_the_lease_is_served_once(make_fleet: FleetFactory,
                                                            tmp_path: Path) -> None:
    # gpu1's server takes 1.5 x the lease to its first token: every prompt gpu1 takes is held
    # past the visibility timeout while gpu1 lives and renews it.
    ttft_ms = 1.5 * LEASE_S * 1000
    fleet = make_fleet(gpus=2, gpu_sim_args={1: ["--ttft-ms", f"{ttft_ms:.0f}"]},
                       worker_env=DEFAULT_LEASE)
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    rows = 40
    kinds = make_prompts(prompts, rows)
    client = redis.Redis.from_url(fleet.redis_url)
    gpu0, gpu1 = worker_name(0), worker_name(1)
    threading.Thread(target=produce, args=(fleet, prompts, "long"), daemon=True).start()
    wait_until(lambda: sim_stats(fleet)[1]["num_running_reqs"] > 0, 60,
               "gpu1's server to run requests")
    started = time.monotonic()
    drain(fleet, "long", out, timeout_s=1.5 * LEASE_S + 90)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == rows and not data["failures"]
    assert_fleet_content(fleet, prompts, data)
    stats = sim_stats(fleet)
    # The fault landed: gpu1's server ran requests to the end, each longer than the lease.
    assert served(stats[1]) > 0, "gpu1's server answered nothing: the test proves nothing"
    assert time.monotonic() - started > LEASE_S
    # Served once by the engines and written by the worker that asked: had a lease lapsed,
    # gpu0 would have taken gpu1's prompts from the sweep, asked its own server for them and
    # written them first (without the renewal: gpu1 wrote 0 of its 8, gpu0 all 40).
    slow = [r for r in data["results"] if r["worker"] == gpu1]
    fast = sum(r["worker"] == gpu0 for r in data["results"])
    assert served(stats[1]) == len(slow) and served(stats[0]) == fast, (stats, len(slow), fast)
    assert int(read_hash(client, RunKeys("long").stats)["done"]) == rows
    print(f"\nlease renewed: gpu1 held {len(slow)} prompts for {ttft_ms / 1000:.0f} s each "
          f"(lease {LEASE_S:.0f} s), each served once and written once")


def test_a_worker_frozen_past_its_lease_writes_nothing_twice(make_fleet: FleetFactory,
                                                             tmp_path: Path) -> None:
    # gpu1's first tokens take 3 s, so it holds a full batch when it is frozen.
    fleet = make_fleet(gpus=2, gpu_sim_args={1: ["--ttft-ms", "3000"]},
                       worker_env=DEFAULT_LEASE)
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    rows = 200
    kinds = make_prompts(prompts, rows)
    client = redis.Redis.from_url(fleet.redis_url)
    gpu1, worker = worker_name(1), fleet.workers[1]
    threading.Thread(target=lambda: produce(fleet, prompts, "frozen", wait=True,
                                            reconcile_interval_s=2.0), daemon=True).start()
    wait_until(lambda: sim_stats(fleet)[1]["num_running_reqs"] > 0
               and held.done_count(client, "frozen") >= 10, 60, "gpu1 to hold requests")
    worker.signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        holding = held.unacked_lines(client, "frozen") - held.done_lines(client, "frozen", rows)
        wait_until(lambda: held.done_count(client, "frozen") >= rows - len(holding) - 1, 60,
                   "gpu0 to finish everything gpu1 does not hold")
        holding &= held.unacked_lines(client, "frozen")
        holding -= held.done_lines(client, "frozen", rows)
        assert holding, "gpu1 held nothing when it was frozen: the test proves nothing"
        # Frozen is lost as dead is, until its lease lapses and the sweep hands its prompts
        # to gpu0, which answers them.
        wait_until(lambda: holding <= held.done_lines(client, "frozen", rows), LEASE_S + 60,
                   "gpu1's prompts to be answered by gpu0")
        taken_s = time.monotonic() - frozen_at
    finally:
        worker.signal(signal.SIGCONT)
    # Woken, gpu1 finishes the requests its server answered while it was frozen: the outcome
    # script refuses each as a second outcome.
    wait_until(lambda: "answered by another worker while this one held it past its lease"
               in worker.log_text(), 60, "gpu1's late answers to be refused")
    drain(fleet, "frozen", out, timeout_s=90)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == rows and not data["failures"]
    assert_fleet_content(fleet, prompts, data)
    by_line = {r["line"]: r for r in data["results"]}
    assert all(by_line[line]["worker"] != gpu1 for line in holding)
    done = int(read_hash(client, RunKeys("frozen").stats)["done"])
    assert done == rows, f"the run's counters saw {done} results of {rows}"
    refused = worker.log_text().count("answered by another worker")
    print(f"\nworker frozen past its lease: gpu1 held {len(holding)} prompts; gpu0 answered "
          f"them {taken_s:.0f} s after the freeze; woken, gpu1 had {refused} late answer(s) "
          "refused; every row written once")
