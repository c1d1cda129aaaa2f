"""Leases are on Valkey's clock (fleetgen/queue/broker.py, fleetgen/queue/serverclock.py): a
fleet whose workers' clocks are 120 s ahead and 120 s behind (libfaketime, as NTP off on one
node would leave them) generates every row once while its workers live, and a skewed worker
SIGKILLed mid-run loses its prompts after its lease, as one with a true clock does.

Before: kombu scored each lease with the worker's clock and every worker's sweep compared it
with its own, so the worker ahead swept the others' live prompts and the one behind wrote
leases that had lapsed when written (issue 42: 385 requests for 238 prompts)."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import orjson
import redis

from fleetgen.monitor.status import gather
from fleetgen.queue.wire import KOMBU_UNACKED, LEASES, held_key, task_payload
from tests.support import held
from tests.support.binaries import require_file
from tests.support.content import assert_fleet_content
from tests.support.fleet import FleetFactory, sim_stats, sims_of
from tests.support.held import worker_name
from tests.support.pipeline import assert_exactly_once, drain, make_prompts, produce
from tests.support.waiting import wait_until

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SKEW_S = 120
# What a worker logs for an answer it generated that another worker had written first.
TWICE = re.compile(r"answered by another worker while this one held it past its lease")


def skewed(offset_s: int) -> dict[str, str]:
    """A worker process whose wall clock is `offset_s` off (its monotonic clock true, as NTP
    leaves it)."""
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"{offset_s:+d}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def leases(client: redis.Redis) -> dict[bytes, float]:
    """Each holder (a worker's channel) -> Valkey's time of its last renewal."""
    pairs: list[tuple[bytes, float]] = client.zrange(LEASES, 0, -1, withscores=True)  # type: ignore[assignment]
    return dict(pairs)


def lines_held_by(client: redis.Redis, holder: bytes) -> set[int]:
    """The lines whose unacked copy is in `holder`'s set."""
    tags = list(client.smembers(held_key(holder.decode())))
    copies = client.hmget(KOMBU_UNACKED, tags) if tags else []
    payloads = [task_payload(orjson.loads(raw)[0]) for raw in copies if raw is not None]
    return {int(p["line"]) for p in payloads if p is not None}


def dead_holder(client: redis.Redis, at_kill: dict[bytes, float]) -> bytes:
    """The one holder of `at_kill` that has not renewed since, once every other one has (b""
    until then)."""
    now = leases(client)
    stale = [h for h, renewed in at_kill.items() if now.get(h, renewed) <= renewed]
    return stale[0] if len(stale) == 1 else b""


def served(stats: dict[str, object]) -> int:
    return int(stats["requests_total"].get("200", 0))  # type: ignore[attr-defined]


def test_skewed_clocks_neither_redeliver_live_prompts_nor_keep_dead_ones(
        make_fleet: FleetFactory, tmp_path: Path) -> None:
    require_file(str(LIBFAKETIME), "Debian's libfaketime skews the clocks")
    # Answers of ~5 s (250 tokens at 20 ms), so a prompt is held across sweeps (every 6 s at
    # the default 60 s lease) and the run outlasts several of them. Heartbeats at the users'
    # default (2 s), leases at the default: nothing overridden but the clocks.
    fleet = make_fleet(tpot_ms=20.0, worker_env={"FLEETGEN_HEALTH_INTERVAL_S": "2"},
                       gpu_worker_env={1: skewed(SKEW_S), 2: skewed(-SKEW_S)})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    rows = 240
    kinds = make_prompts(prompts, rows)
    client = redis.Redis.from_url(fleet.redis_url)
    ahead, behind = worker_name(1), worker_name(2)
    threading.Thread(target=lambda: produce(fleet, prompts, "skew", max_output_tokens=400,
                                            wait=True, reconcile_interval_s=2.0),
                     daemon=True).start()
    # The fault landed: each skewed worker measures its own clock against Valkey's at every
    # beat (the beat's `skew_s`), from inside the process libfaketime is loaded in.
    wait_until(lambda: all("skew_s" in held.heartbeat(client, worker_name(g))
                           for g in range(3)), 60, "the workers' heartbeats")
    skews = {w: float(held.heartbeat(client, w)["skew_s"]) for w in (ahead, behind)}
    assert abs(skews[ahead] - SKEW_S) < 5 and abs(skews[behind] + SKEW_S) < 5, skews
    assert abs(float(held.heartbeat(client, worker_name(0))["skew_s"])) < 5
    # A worker 120 s behind is alive to status (its beats are on Valkey's clock).
    wait_until(lambda: held.worker_done(client, "skew", ahead) >= 30
               and sim_stats(fleet)[1]["num_running_reqs"] > 0, 120,
               "the worker ahead to write 30 results and hold requests")
    snapshot = gather(client, "skew")
    assert snapshot is not None
    health = {w.name: w.health for w in snapshot.workers}
    assert health[behind] == "ok" and health[ahead] == "ok", health

    fleet.workers[1].signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert fleet.workers[1].proc.wait(timeout=10) == -signal.SIGKILL
    before = held.worker_done(client, "skew", ahead)
    # The fault landed on a worker holding prompts: its lease is the one no beat renews (the
    # live ones renew every 2 s, far inside the 60 s lease), and its set names what it held.
    at_kill = leases(client)
    dead = wait_until(lambda: dead_holder(client, at_kill), 30,
                      "every live worker to renew its lease")
    lost = lines_held_by(client, dead) - held.done_lines(client, "skew", rows)
    assert lost, "the worker ahead held nothing unwritten when it died: the test proves nothing"
    drain(fleet, "skew", out, timeout_s=150)
    recovered_s = time.monotonic() - killed_at
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == rows and not data["failures"]
    assert_fleet_content(fleet, prompts, data)
    # The dead worker's prompts came back within the bound of a true clock's (lease 60 s,
    # a sweep 6 s; the SIGKILL test's bound).
    assert recovered_s < 120, f"the run took {recovered_s:.0f} s after the kill"
    by_worker = {g: sum(r["worker"] == worker_name(g) for r in data["results"])
                 for g in range(3)}
    assert by_worker[1] == before, "the killed worker wrote results after its death"
    # The recovery ran: the sweep restored the dead holder's prompts (and dropped its lease),
    # and the live workers wrote them.
    assert dead not in leases(client), "the dead worker's lease was never swept"
    by_line = {int(r["line"]): r["worker"] for r in data["results"]}
    assert all(by_line[line] != ahead for line in lost), lost
    # No row generated twice while its worker lived: each live worker's engine served exactly
    # the rows its worker wrote (a live prompt swept to another worker is asked twice), and
    # no worker answered a row another had written.
    stats = sim_stats(fleet)
    assert served(stats[0]) == by_worker[0] and served(stats[2]) == by_worker[2], (
        [served(s) for s in stats], by_worker)
    twice = {g: len(TWICE.findall(fleet.workers[g].log_text())) for g in range(3)}
    assert twice == {0: 0, 1: 0, 2: 0}, twice
    # Its engine served what it wrote and at most a pool (8) in flight at its death.
    assert served(stats[1]) <= before + sims_of(fleet).max_running_requests, (served(stats[1]),
                                                                          before)
    print(f"\nclocks {skews[ahead]:+.0f} s and {skews[behind]:+.0f} s: {rows} rows, "
          f"{sum(served(s) for s in stats)} requests; the worker ahead killed holding "
          f"{len(lost)}, run complete {recovered_s:.1f} s after the kill")
