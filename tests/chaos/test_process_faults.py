"""Kill and restart real processes mid-run: every row must still be written exactly once."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry, generate_latest

from fleetgen.local.fleet import LocalFleet
from fleetgen.monitor.metrics import FleetCollector
from fleetgen.monitor.status import WorkerStatus, gather, render
from fleetgen.queue.celeryconf import sweep_interval_s
from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import RunKeys
from fleetgen.settings.envvars import HEALTH_INTERVAL_S, VISIBILITY_TIMEOUT_S
from producer.progress import Progress
from tests.support import held
from tests.support.cli import Logged, fleetgen_cli
from tests.support.content import assert_fleet_content
from tests.support.fleet import (
    FleetFactory,
    copy_data,
    generated,
    restart_from,
    sim_stats,
    sims_of,
    written,
)
from tests.support.held import worker_name
from tests.support.pipeline import assert_exactly_once, drain, make_prompts, produce, read_output
from tests.support.waiting import wait_until

N = 300


def done_count(fleet: LocalFleet, run: str) -> int:
    return int(redis.Redis.from_url(fleet.redis_url).bitcount(RunKeys(run).done))


def start_producer(fleet: LocalFleet, prompts: Path, run: str) -> threading.Thread:
    thread = threading.Thread(target=produce, args=(fleet, prompts, run), daemon=True)
    thread.start()
    return thread


# At the defaults a user gets: the visibility timeout (the lease each heartbeat renews) and the
# heartbeat interval are the workers' own (local fleets beat every 1 s: fleetgen/local/fleet.py).
DEFAULT_LEASE = {HEALTH_INTERVAL_S.name: str(HEALTH_INTERVAL_S.default)}


def test_worker_sigkill_mid_run_prompts_are_redelivered(make_fleet: FleetFactory,
                                                        tmp_path: Path) -> None:
    """A worker SIGKILLed mid-run (the OOM killer, a node reboot) and never restarted, at the
    default lease: status shows it LOST with what it holds and when that is back, and the run
    is complete within 120 s of the kill with every row once (at the old 7,200 s visibility
    timeout it sat at `in flight 9` for two hours)."""
    fleet = make_fleet(worker_env=DEFAULT_LEASE)
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    rows = 600  # short answers go fast: enough rows that the kill lands mid-run
    kinds = make_prompts(prompts, rows)
    client = redis.Redis.from_url(fleet.redis_url)
    gpu1, worker = worker_name(1), fleet.workers[1]
    # Answers of <= 200 tokens (<= 0.25 s): the survivors' prompts leave `unacked` long
    # before the dead worker's come back (60 s), which tells the two apart. The producer waits
    # for the run and reconciles, as `fleetgen produce` does by default: kombu moves a message
    # into `unacked` after its BRPOP, not with it, so a worker killed in between loses that one
    # message, and only the producer's reconciliation brings it back (a run here lost 1 of 600
    # and never completed with a producer that had exited).
    report: list[Progress] = []
    threading.Thread(target=lambda: report.append(produce(
        fleet, prompts, "kill9", max_output_tokens=200, wait=True, reconcile_interval_s=2.0)),
        daemon=True).start()

    def busy() -> bool:  # a quarter done, gpu1 has written results and holds requests now
        return (held.done_count(client, "kill9") >= rows // 8
                and held.worker_done(client, "kill9", gpu1) > 0
                and sim_stats(fleet)[1]["num_running_reqs"] > 0)

    wait_until(busy, 60, "gpu1 to hold requests after writing results")
    worker.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert worker.proc.wait(timeout=10) == -signal.SIGKILL
    # Dead: from here on nothing of gpu1's changes. Its prompts stay unacked until its lease
    # lapses; the survivors' leave once they finish them.
    before = held.worker_done(client, "kill9", gpu1)
    at_kill = held.unacked_lines(client, "kill9") - held.done_lines(client, "kill9", rows)
    done_at_kill = held.done_count(client, "kill9")
    wait_until(lambda: held.done_count(client, "kill9") >= min(rows, done_at_kill + 32), 30,
               "the surviving workers to cycle their slots")
    stuck = (at_kill & held.unacked_lines(client, "kill9")) - \
        held.done_lines(client, "kill9", rows)
    assert stuck, "gpu1 held nothing unacked when it died: the test proves nothing"
    lost = assert_shown_lost(client, "kill9", gpu1)

    try:
        drain(fleet, "kill9", out, timeout_s=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{where_missing(client, 'kill9', rows, stuck)}") from None
    recovered_s = time.monotonic() - killed_at
    assert recovered_s < 120, f"the run took {recovered_s:.0f} s after the kill"
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == rows and not data["failures"]
    assert_fleet_content(fleet, prompts, data)
    by_line = {r["line"]: r for r in data["results"]}
    after = sum(r["worker"] == gpu1 for r in data["results"])
    assert after == before, f"gpu1 wrote {after - before} results after it was killed"
    assert all(by_line[line]["worker"] != gpu1 for line in stuck)
    # A row gpu1 wrote but had not acked comes back too, and is skipped as done.
    wait_until(lambda: client.hlen("unacked") == 0, 30, "every redelivery to be acked")
    wait_until(lambda: bool(report), 30, "the producer to see the run generated")
    print(f"\nworker SIGKILL at the default lease: gpu1 wrote {before} results before the "
          f"kill, 0 after; status showed it {lost.health}; its "
          f"{len(stuck)} unacked prompts were redelivered and written by "
          f"{sorted({by_line[line]['worker'].split('@')[0] for line in stuck})}; run complete "
          f"{recovered_s:.1f} s after the kill; {report[0].requeued} lost between a BRPOP and "
          f"its unacked entry, re-enqueued")


def assert_shown_lost(client: redis.Redis, run: str, worker: str) -> WorkerStatus:
    """What the user sees while a dead or frozen worker's prompts wait for its lease: status
    (and the live page, from the same gather) names it LOST, what it holds, and when that is
    back; metrics says it too."""
    def lost() -> WorkerStatus | None:
        snapshot = gather(client, run)
        found = [w for w in snapshot.workers if w.name == worker] if snapshot else []
        return found[0] if found and found[0].lost else None

    wait_until(lambda: lost() is not None, 30, f"status to show {worker} lost")
    w, snapshot = lost(), gather(client, run)
    assert w is not None and snapshot is not None
    assert w.health.startswith("LOST") and w.back_in_s is not None
    lease_s = VISIBILITY_TIMEOUT_S.default
    assert 0 < w.back_in_s <= lease_s + sweep_interval_s(lease_s)
    # What no live worker renews, from kombu's index: what the dead worker held at its death,
    # not at its last beat (it may have taken more between the two); its line in status.
    wait_until(lambda: (gather(client, run) or snapshot).lost_held > 0, 30,
               "the dead worker's leases to go unrenewed")
    snapshot = gather(client, run) or snapshot
    assert snapshot.lost_back_in_s is not None
    assert 0 < snapshot.lost_back_in_s <= lease_s + sweep_interval_s(lease_s)
    text = render(snapshot)
    assert f"held by lost worker(s) {worker}: back in the queue within" in text, text
    registry = CollectorRegistry()
    registry.register(FleetCollector(client, runs=lambda: [run]))
    exposed = generate_latest(registry).decode()
    assert f'fleetgen_worker_lost{{worker="{worker}"}} 1.0' in exposed
    return w


def where_missing(client: redis.Redis, run: str, rows: int, stuck: set[int] | None = None
                  ) -> str:
    """Where the rows without an outcome are: a failure says which path did not bring them
    back (kombu's restore: in `unacked`, its lock's TTL; the producer's reconciliation: in
    neither). `stuck`: what the SIGKILLed gpu1 held."""
    missing = set(range(1, rows + 1)) - held.done_lines(client, run, rows)
    unacked, queued = held.unacked_lines(client, run), held.queued_lines(client, run)
    at_kill = "" if stuck is None else f"held by gpu1 at the kill {sorted(missing & stuck)}, "
    return (f"missing lines {sorted(missing)}: {at_kill}in unacked {sorted(missing & unacked)}, "
            f"queued {sorted(missing & queued)}; restore lock TTL {client.ttl('unacked_mutex')} s")


def test_worker_sigterm_finishes_what_it_holds(make_fleet: FleetFactory,
                                               tmp_path: Path) -> None:
    # A visibility timeout far longer than the test: nothing may be left to it.
    fleet = make_fleet(worker_env={"FLEETGEN_VISIBILITY_TIMEOUT_S": "3600"})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N)
    client = redis.Redis.from_url(fleet.redis_url)
    gpu1, worker = worker_name(1), fleet.workers[1]
    start_producer(fleet, prompts, "term")
    wait_until(lambda: held.done_count(client, "term") >= N // 4
               and sim_stats(fleet)[1]["num_running_reqs"] > 0
               and int(held.heartbeat(client, gpu1).get("inflight", 0)) > 0, 60,
               "a quarter of the rows, and gpu1 holding requests")
    before = held.worker_done(client, "term", gpu1)
    worker.signal(signal.SIGTERM)
    # Warm shutdown: it takes nothing more and finishes what it holds (requests < 4.2 s).
    assert worker.proc.wait(timeout=60) == 0, worker.log_text()[-2000:]
    finished = held.worker_done(client, "term", gpu1) - before
    assert finished > 0, "gpu1 finished nothing after SIGTERM: it held nothing"
    drain(fleet, "term", out, timeout_s=90)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == N and not data["failures"]
    assert_fleet_content(fleet, prompts, data)
    assert sum(r["worker"] == gpu1 for r in data["results"]) == before + finished
    print(f"\nworker SIGTERM (short requests): gpu1 wrote {before} results before the "
          f"signal and finished the {finished} it held during its warm shutdown")


def test_worker_sigterm_hands_back_what_it_cannot_finish(make_fleet: FleetFactory,
                                                         tmp_path: Path) -> None:
    # gpu1's server takes 120 s to its first token: nothing it holds can finish inside the
    # hand-back grace (FLEETGEN_HANDBACK_S, 5 s here), so what it holds must be handed back.
    # A visibility timeout far longer than the test: only that hand-back can finish the run.
    # (Celery's SIGTERM alone is a warm shutdown that waits for running tasks without limit,
    # and its threads pool cannot cancel one: workers/handback.py.)
    fleet = make_fleet(gpu_sim_args={1: ["--ttft-ms", "120000", "--drain-timeout-s", "1"]},
                       worker_env={"FLEETGEN_VISIBILITY_TIMEOUT_S": "3600",
                                   "FLEETGEN_HANDBACK_S": "5"})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N)
    client = redis.Redis.from_url(fleet.redis_url)
    gpu1, worker = worker_name(1), fleet.workers[1]
    start_producer(fleet, prompts, "handback")
    slots = sims_of(fleet).max_running_requests
    wait_until(lambda: sim_stats(fleet)[1]["num_running_reqs"] == slots
               and int(held.heartbeat(client, gpu1).get("inflight", 0)) == slots, 60,
               "gpu1 to hold a full batch")
    first = held.unacked_lines(client, "handback")
    done_then = held.done_count(client, "handback")
    wait_until(lambda: held.done_count(client, "handback") >= min(N - slots, done_then + 48), 60,
               "the other workers to cycle their slots")
    # Unacked then and now, and not done: gpu1's (the others finish theirs in < 4.2 s).
    holding = (first & held.unacked_lines(client, "handback")) - \
        held.done_lines(client, "handback", N)
    assert len(holding) >= slots, f"gpu1 held {len(holding)} prompts, expected {slots}"
    stopped_at = time.monotonic()
    worker.signal(signal.SIGTERM)
    worker.proc.wait(timeout=45)  # the 5 s grace, then the hand-back and exit
    shutdown_s = time.monotonic() - stopped_at
    drain(fleet, "handback", out, timeout_s=90)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == N and not data["failures"]
    assert_fleet_content(fleet, prompts, data)
    by_line = {r["line"]: r for r in data["results"]}
    assert sim_stats(fleet)[1]["requests_total"].get("200", 0) == 0  # gpu1 finished nothing
    assert all(by_line[line]["worker"] != gpu1 for line in holding)
    assert "handed back to the queue" in worker.log_path.read_text()
    print(f"\nworker SIGTERM: gpu1 held {len(holding)} prompts, finished 0, exited after "
          f"{shutdown_s:.1f} s and handed all back")


def test_drainer_sigkilled_repeatedly_repairs_torn_lines(make_fleet: FleetFactory,
                                                         tmp_path: Path) -> None:
    # ~40 rows/s: the run outlasts four drainer start-ups, so each kill finds it unfinished.
    fleet = make_fleet(tpot_ms=2.0)
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 600)
    producer = start_producer(fleet, prompts, "drainkill")
    argv = fleetgen_cli("drain", "--run", "drainkill", "--out", str(out), "--batch", "16",
                        "--redis", fleet.redis_url)
    rounds: list[int] = []
    for round_no in range(4):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        start = written(out)
        target = start + 40
        wait_until(lambda t=target, p=proc: written(out) >= t or p.poll() is not None, 60,
                   "the drainer to write more")
        # Killed while alive and working, not found finished (or crashed) by itself.
        assert proc.poll() is None, f"round {round_no}: the drainer exited by itself " \
            f"({proc.returncode}): {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
        proc.kill()
        assert proc.wait() == -signal.SIGKILL
        rounds.append(written(out) - start)
        assert rounds[-1] >= 40
        if round_no == 1:  # what a kill in the middle of a write() leaves behind
            with (out / "results.jsonl").open("ab") as f:
                f.write(b'{"id": "torn", "completion": "half a li')
    producer.join(timeout=60)
    summary = drain(fleet, "drainkill", out, timeout_s=120)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert summary["done"] == 600 == len(data["results"])
    assert_fleet_content(fleet, prompts, data)
    print(f"\ndrainer SIGKILL x4: lines written per round before each kill {rounds}, "
          f"every kill while alive (returncode -9); 600 results, exactly once")


def test_valkey_killed_and_restarted_mid_run(make_fleet: FleetFactory, tmp_path: Path) -> None:
    fleet = make_fleet()
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N)
    producer = Logged(
        # A small high-water mark keeps the producer mid-enqueue when Redis goes away.
        tmp_path / "produce.log", "produce", str(prompts), "--run", "vk", "--context-length",
        "4096", "--reconcile-interval", "2", "--high-water", "30", "--batch-size", "10",
        "--redis", fleet.redis_url)
    drainer = Logged(tmp_path / "drain.log", "drain", "--run", "vk", "--out", str(out),
                     "--redis", fleet.redis_url)
    wait_until(lambda: written(out) >= N // 4, 90, "a quarter of the rows written")
    # Valkey comes back from a copy older than the moment it died (as after a crash that
    # lost unsynced writes, only more): rows queued since the copy are gone with it.
    copy = copy_data(fleet.valkey, tmp_path / "copy")
    wait_until(lambda: written(out) >= N // 2, 90, "half of the rows written")
    restart_from(fleet.valkey, copy)
    client = redis.Redis.from_url(fleet.redis_url)

    def stuck() -> str:
        return (f"{written(out)} rows written; {where_missing(client, 'vk', N)}\n"
                f"the producer's log:\n{producer.text()[-4000:]}")

    drainer.wait(150, also=stuck)
    report = producer.wait(30)
    requeued = re.search(r"(\d+) re-enqueued after loss", report)
    assert requeued and int(requeued.group(1)) > 0, report  # reconciliation really ran
    print(f"re-enqueued after the restore: {requeued.group(1)}")
    data = assert_exactly_once(out, set(kinds["good"]))
    assert assert_fleet_content(fleet, prompts, data) == N


def test_producer_killed_mid_enqueue_and_rerun(make_fleet: FleetFactory,
                                               tmp_path: Path) -> None:
    fleet = make_fleet()
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N, too_long=3, long_tokens=6000)
    argv = fleetgen_cli("produce", str(prompts), "--run", "pk", "--context-length", "4096",
                        "--high-water", "20", "--batch-size", "10", "--redis", fleet.redis_url)
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: int(read_hash(client, RunKeys("pk").manifest).get("read", 0)) >= 100, 60,
               "the producer to read 100 rows")
    first.kill()
    first.wait()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    drain(fleet, "pk", out, timeout_s=120)
    data = assert_exactly_once(out, set(kinds["good"]) | set(kinds["too_long"]))
    # Nothing was generated twice: the simulators served exactly one completion per row.
    assert generated(fleet) == len(data["results"]) == N
    assert_fleet_content(fleet, prompts, data)

    before = {p.name: p.read_bytes() for p in out.glob("*.jsonl")}
    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0 and "already complete" in rerun.stdout
    drain(fleet, "pk", out, timeout_s=30)
    assert {p.name: p.read_bytes() for p in out.glob("*.jsonl")} == before
    assert generated(fleet) == N
    assert read_output(out)["rejected"][0]["reason"].startswith("prompt_too_long")
