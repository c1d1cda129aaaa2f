"""A misbehaving engine: 5xx, queue full, hangs, drops, downtime, death, a tokenizer that counts
more. Every row must end as a result (or a failure where a failure is right), never a loop."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

import httpx
import redis

from fleetgen.queue.contract import worker_key
from fleetgen.queue.redisconn import read_hash
from fleetgen.runstate.keys import RunKeys
from producer.tokenizer import load_tokenizer
from tests.support import held
from tests.support.content import assert_fleet_content
from tests.support.fleet import FleetFactory, generated, sim_stats, sims_of
from tests.support.held import worker_name
from tests.support.pipeline import assert_exactly_once, drain, make_prompts, produce, run_pipeline
from tests.support.waiting import wait_until

N = 300


def test_flaky_engine_every_row_completes_and_retries_are_counted(make_fleet: FleetFactory,
                                                                 tmp_path: Path) -> None:
    fleet = make_fleet(
        sim_args=["--error-rate", "0.08", "--queue-full-rate", "0.05", "--hang-rate", "0.02",
                  "--drop-rate", "0.03"],
        # A hung request (--hang-rate) times out in 6 s, not the default 900 s; quick retries.
        worker_env={"FLEETGEN_REQUEST_TIMEOUT_S": "6",
                    "FLEETGEN_MAX_ATTEMPTS": "10", "FLEETGEN_BACKOFF_BASE_S": "0.05",
                    "FLEETGEN_BACKOFF_CAP_S": "0.5"})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N)
    run_pipeline(fleet, prompts, "flaky", out, timeout_s=180)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == N and not data["failures"]
    assert_fleet_content(fleet, prompts, data)  # a retried row gets the same answer
    retried = [r for r in data["results"] if r["attempts"] > 1]
    faults = {k: sum(s["faults_total"].get(k, 0) for s in sim_stats(fleet))
              for k in ("error", "queue_full", "hang", "drop")}
    assert all(v > 0 for v in faults.values()), faults  # every kind of fault happened
    assert len(retried) >= sum(faults.values()) * 0.5, (len(retried), faults)
    stats = read_hash(redis.Redis.from_url(fleet.redis_url), RunKeys("flaky").stats)
    assert int(stats["retries"]) == sum(r["attempts"] - 1 for r in data["results"])


def consuming(fleet_url: str, worker: str) -> str | None:
    return read_hash(redis.Redis.from_url(fleet_url), worker_key(worker)).get("consuming")


def test_engine_down_for_a_while_its_worker_pauses_then_resumes(make_fleet: FleetFactory,
                                                                tmp_path: Path) -> None:
    fleet = make_fleet(worker_env={"FLEETGEN_HEALTH_INTERVAL_S": "0.5"})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 600)
    gpu1 = f"gpu1@{socket.gethostname()}"
    client = redis.Redis.from_url(fleet.redis_url)
    thread = threading.Thread(target=produce, args=(fleet, prompts, "down"), daemon=True)
    thread.start()
    wait_until(lambda: client.bitcount(RunKeys("down").done) >= 60, 60, "some rows done")
    httpx.post(fleet.engine_url(1) + "/_sim/down", json={"seconds": 6})
    wait_until(lambda: consuming(fleet.redis_url, gpu1) == "0", 10, "gpu1 to stop consuming")
    done_while_down = int(read_hash(client, RunKeys("down").stats).get(f"{gpu1}|done", 0))
    wait_until(lambda: consuming(fleet.redis_url, gpu1) == "1", 20, "gpu1 to take prompts again")
    summary = drain(fleet, "down", out, timeout_s=120)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert summary["failed"] == 0 and len(data["results"]) == 600
    assert_fleet_content(fleet, prompts, data)
    done_after = int(read_hash(client, RunKeys("down").stats).get(f"{gpu1}|done", 0))
    assert done_after > done_while_down, "gpu1 never worked again after its server came back"
    # Its prompts were handed to the other GPUs, not failed: no 503 ended as a failure.
    assert all(r["finish_reason"] in ("stop", "length") for r in data["results"])


def test_engine_dead_for_good_the_run_still_completes(make_fleet: FleetFactory,
                                                      tmp_path: Path) -> None:
    # gpu2's server in a process of its own, SIGKILLed once it is serving requests and its
    # worker has written results: a crash in the middle of the run, not before it.
    fleet = make_fleet(gpu_sim_args={2: []})
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, N)
    client = redis.Redis.from_url(fleet.redis_url)
    gpu2 = worker_name(2)
    thread = threading.Thread(target=produce, args=(fleet, prompts, "dead"), daemon=True)
    thread.start()
    wait_until(lambda: held.worker_done(client, "dead", gpu2) >= 5
               and sim_stats(fleet)[2]["num_running_reqs"] > 0, 60,
               "gpu2 to write results and hold running requests")
    holding = held.unacked_tasks(client, "dead")  # task id -> line, every worker's
    before = held.worker_done(client, "dead", gpu2)
    sims_of(fleet).children[2].signal(signal.SIGKILL)
    assert sims_of(fleet).children[2].proc.wait(timeout=10) == -signal.SIGKILL
    # Its worker stops consuming and lets go of every prompt it held.
    wait_until(lambda: held.heartbeat(client, gpu2).get("consuming") == "0"
               and held.heartbeat(client, gpu2).get("inflight") == "0", 20,
               "gpu2's worker to stop consuming and hold nothing")
    at_death = held.worker_done(client, "dead", gpu2)
    handed_back = held.handed_back(fleet.workers[2].log_text(), holding)
    assert handed_back, "gpu2 handed nothing back: the kill did not land mid-request"
    summary = drain(fleet, "dead", out, timeout_s=150)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert summary["failed"] == 0 and len(data["results"]) == N
    assert_fleet_content(fleet, prompts, data)
    by_line = {r["line"]: r for r in data["results"]}
    with_gpu2 = sum(r["worker"] == gpu2 for r in data["results"])
    assert 0 < before <= with_gpu2 == at_death, (before, with_gpu2, at_death)
    assert all(by_line[line]["worker"] != gpu2 for line in handed_back)
    print(f"\nengine dead: gpu2 {with_gpu2} results before its server died "
          f"({before} when the kill was sent), 0 after; {len(handed_back)} prompts it held "
          f"handed back and written by "
          f"{sorted({by_line[line]['worker'].split('@')[0] for line in handed_back})}")


def test_tokenizer_mismatch_self_heals_once_or_fails_with_reason(make_fleet: FleetFactory,
                                                                 tmp_path: Path) -> None:
    ctx = 2048
    fleet = make_fleet(context_length=ctx, sim_args=["--extra-prompt-tokens", "4"])
    tok = load_tokenizer("qwen3.6")
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    rows = [f'{{"id": "short{i}", "prompt": "Tell me about {i}."}}' for i in range(40)]
    # A prompt our tokenizer counts as 2 tokens under the scheduler's limit: it fits for us,
    # but the server's count (4 more) pushes it over, and no smaller budget can help.
    edge = "a" + " a" * (ctx - 1 - 5 - 3)
    assert tok.count(edge) == ctx - 8
    rows.append(f'{{"id": "edge", "prompt": "{edge}"}}')
    prompts.write_text("\n".join(rows) + "\n")
    run_pipeline(fleet, prompts, "mismatch", out, timeout_s=90, min_output_tokens=1)
    data = assert_exactly_once(out, {f"short{i}" for i in range(40)} | {"edge"})
    assert assert_fleet_content(fleet, prompts, data) == 40  # the server's count, +4
    for r in data["results"]:
        assert r["attempts"] == 2  # one context-length 400, one corrected request
        assert r["max_tokens"] == ctx - (r["prompt_tokens"]) - 2
    [failure] = data["failures"]
    assert failure["id"] == "edge" and failure["attempts"] == 1
    assert failure["error"]["status"] == 400 and failure["error"]["type"] == "context_length"
    assert "maximum context length of 2048" in failure["error"]["message"]
    assert generated(fleet) == 40  # and no request loop: 40 + 40 + 1 generate calls in all
    codes = [s["requests_total"] for s in sim_stats(fleet)]
    assert sum(c.get("400", 0) for c in codes) == 41
