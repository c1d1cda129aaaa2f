"""`--turns all` under kills: a worker, the drainer and the producer SIGKILLed during one
multi-turn run, and Valkey restored from an older copy during another; every (row, turn) is
still written exactly once, no turn before the turn it follows, each the simulator's answer
to the history written before it."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import redis

from tests.support.cli import Logged, fleetgen_cli
from tests.support.fleet import FleetFactory, copy_data, generated, restart_from, sim_stats, written
from tests.support.pipeline import assert_exactly_once, read_output, write_jsonl
from tests.support.turns import assert_turns_content, expected_keys, input_row
from tests.support.waiting import wait_until


def many(n: int) -> dict[str, dict[str, Any]]:
    """n conversations of 1 to 4 user turns, the dataset's own answers between them."""
    return {f"m{i}": {"system": "Be brief." if i % 2 else None, "sharegpt": i % 7 == 3,
                      "trailing_answer": i % 3 == 0,
                      "users": [f"Turn {j + 1} of {i}: say something about {i + j}."
                                for j in range(1 + i % 4)]} for i in range(n)}


def test_turns_exactly_once_through_worker_drainer_and_producer_kills(
        make_fleet: FleetFactory, tmp_path: Path) -> None:
    # The lease and request timeout are the users' defaults: the SIGKILLed worker's turns come
    # back when its lease lapses (~66 s), as on a real fleet.
    fleet = make_fleet(tpot_ms=4.0)
    convs = many(150)
    turns = sum(len(c["users"]) for c in convs.values())
    prompts = write_jsonl(tmp_path / "p.jsonl", [input_row(i, c) for i, c in convs.items()])
    out = tmp_path / "out"
    produce = ("produce", str(prompts), "--run", "tk", "--context-length", "4096",
               "--turns", "all", "--out", str(out), "--reconcile-interval", "2",
               "--max-output-tokens", "400", "--redis", fleet.redis_url)
    drain = ("drain", "--run", "tk", "--out", str(out), "--batch", "16",
             "--redis", fleet.redis_url)
    producer = Logged(tmp_path / "produce.log", *produce)
    drainer = Logged(tmp_path / "drain.log", *drain)
    gpu1 = fleet.workers[1]

    wait_until(lambda: written(out) >= turns // 5 and sim_stats(fleet)[1]["num_running_reqs"] > 0,
               90, "a fifth of the turns written, gpu1 holding requests")
    gpu1.signal(signal.SIGKILL)
    assert gpu1.proc.wait(timeout=10) == -signal.SIGKILL
    at_worker_kill = written(out)

    events = redis.Redis.from_url(fleet.redis_url)
    wait_until(lambda: written(out) >= at_worker_kill + turns // 5
               and events.xlen("fleetgen:run:tk:events") > 0, 90,
               "more turns written, outcomes in the stream the drainer has not written yet")
    assert drainer.proc.poll() is None, drainer.text()
    drainer.proc.kill()
    assert drainer.proc.wait() == -signal.SIGKILL
    at_drainer_kill = written(out)
    drainer = Logged(tmp_path / "drain-again.log", *drain)

    wait_until(lambda: written(out) >= at_drainer_kill + turns // 5, 90, "more turns written")
    assert producer.proc.poll() is None, producer.text()
    producer.proc.kill()
    assert producer.proc.wait() == -signal.SIGKILL
    at_producer_kill = written(out)
    assert at_producer_kill < turns - 20, "the run was nearly over: the kill proves little"
    producer = Logged(tmp_path / "produce-again.log", *produce)

    report = producer.wait(180)
    drainer.wait(60)
    data = assert_exactly_once(out, expected_keys(convs))
    assert len(data["results"]) == turns and not data["failures"] and not data["rejected"]
    assert assert_turns_content(fleet, convs, data["results"], {}) == turns
    served = generated(fleet)
    print(f"\n--turns all, {len(convs)} conversations, {turns} turns: gpu1 SIGKILLed at "
          f"{at_worker_kill} written, drainer at {at_drainer_kill}, producer at "
          f"{at_producer_kill}; {turns} results exactly once, {served} completions served by "
          f"the simulators; {report.strip()}")


def test_turns_converge_after_valkey_restored_from_an_older_copy(
        make_fleet: FleetFactory, tmp_path: Path) -> None:
    fleet = make_fleet(tpot_ms=3.0)
    convs = many(120)
    turns = sum(len(c["users"]) for c in convs.values())
    prompts = write_jsonl(tmp_path / "p.jsonl", [input_row(i, c) for i, c in convs.items()])
    out = tmp_path / "out"
    producer = Logged(
        # A small high-water mark keeps first turns waiting to be enqueued when Valkey goes.
        tmp_path / "produce.log", "produce", str(prompts), "--run", "tv", "--context-length",
        "4096", "--turns", "all", "--out", str(out), "--reconcile-interval", "2",
        "--max-output-tokens", "400", "--high-water", "20", "--batch-size", "10",
        "--redis", fleet.redis_url)
    drainer = Logged(tmp_path / "drain.log", "drain", "--run", "tv", "--out", str(out),
                     "--redis", fleet.redis_url)
    wait_until(lambda: written(out) >= turns // 4, 90, "a quarter of the turns written")
    # Queued next turns, done bits and stream entries written after the copy are lost with it.
    copy = copy_data(fleet.valkey, tmp_path / "copy")
    wait_until(lambda: written(out) >= turns // 2, 90, "half of the turns written")
    restart_from(fleet.valkey, copy)
    drainer.wait(150, also=lambda: f"the producer's log:\n{producer.text()[-4000:]}")
    report = producer.wait(60)
    requeued = re.search(r"(\d+) re-enqueued after loss", report)
    assert requeued and int(requeued.group(1)) > 0, report  # reconciliation really ran
    data = assert_exactly_once(out, expected_keys(convs))
    assert len(data["results"]) == turns
    assert assert_turns_content(fleet, convs, data["results"], {}) == turns
    client = redis.Redis.from_url(fleet.redis_url)
    assert client.xlen("fleetgen:run:tv:events") == 0
    print(f"\n--turns all, Valkey restored from a copy taken at a quarter: {turns} turns "
          f"exactly once, {requeued.group(1)} re-enqueued after loss")


def test_failed_turn_stops_its_conversation_and_retry_resumes_it(
        make_fleet: FleetFactory, tmp_path: Path) -> None:
    """One attempt per delivery against a server failing a fifth of its requests: failed turns
    hold their conversations back (the run still completes), `fleetgen retry` and the same
    `fleetgen produce` carry them on, until every turn is a result, each exactly once."""
    fleet = make_fleet(sim_args=["--error-rate", "0.2"],
                       worker_env={"FLEETGEN_MAX_ATTEMPTS": "1"})
    convs = many(30)
    turns = sum(len(c["users"]) for c in convs.values())
    prompts = write_jsonl(tmp_path / "p.jsonl", [input_row(i, c) for i, c in convs.items()])
    out = tmp_path / "out"
    argv = ("--run", "tr", "--context-length", "4096", "--max-output-tokens", "100")

    def round_trip() -> dict[str, Any]:
        producer = Logged(tmp_path / "produce.log", "produce", str(prompts), *argv, "--turns",
                          "all", "--out", str(out), "--reconcile-interval", "2",
                          "--redis", fleet.redis_url)
        drainer = Logged(tmp_path / "drain.log", "drain", "--run", "tr", "--out", str(out),
                         "--redis", fleet.redis_url)
        producer.wait(120)
        drainer.wait(60)
        summary: dict[str, Any] = orjson.loads((out / "summary.json").read_bytes())
        assert summary["complete"], summary
        return summary

    summary = round_trip()
    data = read_output(out)
    assert data["failures"], "no turn failed: the test proves nothing"
    held_back = sum(f["turns"] - f["turn"] for f in data["failures"])
    assert summary["blocked"] == held_back
    assert held_back > 0, "no failure held a later turn back"
    status = subprocess.run(fleetgen_cli("status", "--run", "tr", "--json", "--redis",
                                         fleet.redis_url), capture_output=True, text=True,
                            timeout=60)
    shown = orjson.loads(status.stdout)
    shown = shown[0] if isinstance(shown, list) else shown
    assert (shown["blocked"], shown["total"]) == (held_back, turns)
    # Nothing of a conversation after its failed turn was generated.
    failed_at = {f["id"]: f["turn"] for f in data["failures"]}
    assert not [r for r in data["results"] if r["turn"] > failed_at.get(r["id"], 99)]
    rounds = [len(data["failures"])]
    for _ in range(20):
        retried = subprocess.run(fleetgen_cli("retry", "--run", "tr", "--redis",
                                              fleet.redis_url), capture_output=True, text=True,
                                 timeout=60)
        assert retried.returncode == 0, retried.stderr
        if "no failed rows" in retried.stdout:
            break
        assert "conversations go on" in retried.stdout
        round_trip()
        rounds.append(len(read_output(out)["failures"]))
        assert_exactly_once(out, set().union(*[
            {f"{r['id']}@{r['turn']}"} for kind in read_output(out).values() for r in kind]))
    data = assert_exactly_once(out, expected_keys(convs))
    assert len(data["results"]) == turns and not data["failures"]
    assert assert_turns_content(fleet, convs, data["results"], {}) == turns
    print(f"\n--turns all with failures: failed turns per round {rounds}; {turns} turns "
          f"exactly once at the end")
