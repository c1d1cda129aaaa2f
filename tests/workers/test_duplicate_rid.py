"""A prompt delivered twice to one server while its first delivery still runs: SGLang refuses
a rid already in flight (400 `Duplicate request ID`), so every delivery needs its own rid."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
import redis

from fleetgen.queue.contract import TaskPayload
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_PRODUCED
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import run_in_thread
from producer.enqueue import Enqueuer
from tests.support.content import expected
from tests.support.pipeline import drain_until_complete
from tests.support.waiting import wait_until
from tests.support.workers import start_worker, stop

# Starts real Celery worker processes: the fleet tier (tests/conftest.py).
pytestmark = pytest.mark.fleet


def test_a_redelivery_beside_the_first_gets_its_own_rid(redis_url: str, tmp_path: Path) -> None:
    run = "dup"
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    payload = TaskPayload(run=run, line=1, id="d1", input_ids=[5, 6, 7, 8], max_tokens=16,
                          sampling={}, row={})
    # A first token after 3 s keeps the first delivery running while the second arrives.
    config = SimConfig(port=0, ttft_ms=3000, tpot_ms=0, health_delay_s=0)
    with run_in_thread(config) as sim:
        proc = start_worker(redis_url, sim.url, "dup", tmp_path / "w.log", concurrency=2,
                            env={"FLEETGEN_BACKOFF_BASE_S": "0.05"})
        try:
            client.hset(keys.manifest, "state", "producing")  # a run the worker knows
            Enqueuer(client, run).send([payload, payload])  # the same message, twice
            with httpx.Client(base_url=sim.url) as http:
                wait_until(lambda: http.get("/_sim/stats").json()["num_running_reqs"] >= 1, 60,
                           "the first delivery to be running")
                # Both deliveries answered by the server (no 400 for the second's rid) ...
                wait_until(lambda: http.get("/_sim/stats").json()["requests_total"]
                           .get("200", 0) >= 2, 60, "both deliveries to finish")
                served = http.get("/_sim/stats").json()["requests_total"]
            # ... and the later answer refused as a second outcome (workers/sink.py).
            wait_until(lambda: "answered by another worker" in (tmp_path / "w.log").read_text(),
                       30, "the second answer to be refused")
        finally:
            stop(proc)
    assert served == {"200": 2}, served
    kinds = [fields[b"k"].decode() for _, fields in client.xrange(keys.stream)]
    records = [orjson.loads(fields[b"d"]) for _, fields in client.xrange(keys.stream)]
    assert kinds == ["result"], records
    assert client.hget(keys.stats, "failed") is None
    assert client.hget(keys.stats, "done") == b"1"

    client.hset(keys.manifest, mapping={"state": STATE_PRODUCED, "total": 1})
    out = tmp_path / "out"
    drainer = drain_until_complete(redis_url, run, out, timeout_s=30)
    assert drainer.complete()
    rows = (out / "results.jsonl").read_bytes().splitlines()
    assert [orjson.loads(r)["id"] for r in rows] == ["d1"]
    # The delivery written got the whole answer for the prompt.
    want = expected(payload["input_ids"], 16, config, {})
    written = orjson.loads(rows[0])
    assert {k: written[k] for k in want} == want
    assert all({k: r[k] for k in want} == want for r in records)
    assert not (out / "failures.jsonl").exists() or not (out / "failures.jsonl").read_bytes()
