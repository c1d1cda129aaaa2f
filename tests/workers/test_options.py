"""Issue 12 through a real Celery worker: payloads asking for the reasoning split, a JSON schema
and logprobs, answered by a simulated thinking model; every record is recomputed from the
simulator's model, and the drainer's counts (json_invalid, reasoning_unfinished, empty) match
the records, the workers' stats, and a restarted drainer's rebuild from the files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from fleetgen.drainer import Drainer
from fleetgen.queue.contract import TaskPayload
from fleetgen.queue.redisconn import connect, read_hash
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

THINK, END, NL, PARA = 248068, 248069, 198, 271
SCHEMA = json.dumps({"type": "object", "properties": {
    "title": {"type": "string"}, "score": {"type": "number", "minimum": 0, "maximum": 1},
    "labels": {"type": "array", "items": {"enum": ["pos", "neg"]}}},
    "required": ["title", "score"]})
RUN = "opts"
# kind -> (prompt suffix, payload options, budget)
KINDS: dict[str, tuple[list[int], dict[str, Any], int]] = {
    "thinks": ([], {"think": True}, 400),
    "opened": ([THINK, NL], {"think": True, "think_open": True}, 400),
    "off": ([THINK, PARA, END, PARA], {"think": True}, 400),
    "think-json": ([THINK, NL], {"think": True, "think_open": True, "json_schema": SCHEMA}, 400),
    # enable_thinking false: a grammar told to wait for </think> would never apply
    "off-json": ([THINK, PARA, END, PARA], {"think": True, "json_schema": SCHEMA}, 400),
    "json": ([], {"json_schema": SCHEMA}, 400),
    "logprobs": ([], {"think": True, "logprobs": 4}, 400),
    "cut": ([], {"think": True}, 6),
    "plain": ([], {}, 400),
}
PER_KIND = 3


def payloads() -> list[TaskPayload]:
    out: list[TaskPayload] = []
    for kind, (suffix, options, budget) in KINDS.items():
        for _ in range(PER_KIND):
            line = len(out) + 1
            payload = TaskPayload(run=RUN, line=line, id=f"{kind}{line}",
                                  input_ids=[1000 + line, 2000 + line, 3000 + line, *suffix],
                                  max_tokens=budget, sampling={}, row={"kind": kind})
            payload.update(options)  # type: ignore[typeddict-item]
            out.append(payload)
    return out


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_reasoning_json_and_logprobs_through_a_worker(redis_url: str, tmp_path: Path,
                                                      flavor: str) -> None:
    """SGLang's native /generate, and vLLM's /v1/completions (the worker detects the protocol;
    vLLM's extensions: skip_special_tokens, return_token_ids, structured_outputs, logprobs as
    token ids)."""
    config = SimConfig(port=0, thinking=True, output_tokens_mean=20, context_length=4096,
                       json_invalid_rate=0.5, ttft_ms=0, tpot_ms=0, health_delay_s=0,
                       flavor=flavor)
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(RUN)
    sent = payloads()
    with run_in_thread(config) as sim:
        proc = start_worker(redis_url, sim.url, "opts", tmp_path / "w.log", concurrency=4)
        try:
            client.hset(keys.manifest, mapping={"state": STATE_PRODUCED, "total": len(sent)})
            Enqueuer(client, RUN).send(sent)
            wait_until(lambda: client.xlen(keys.stream) >= len(sent), 120, "every outcome")
        finally:
            stop(proc)
    out = tmp_path / "out"
    drainer = drain_until_complete(redis_url, RUN, out, timeout_s=60)
    assert drainer.complete()

    records = {r["id"]: r for r in map(orjson.loads,
                                       (out / "results.jsonl").read_bytes().splitlines())}
    assert len(records) == len(sent), (tmp_path / "w.log").read_text()[-3000:]
    wanted_counts = {"empty": 0, "reasoning_unfinished": 0, "json_invalid": 0}
    for payload in sent:
        options = {k: payload[k] for k in ("think", "think_open", "json_schema", "logprobs")
                   if k in payload}
        want = expected(payload["input_ids"], payload["max_tokens"], config, {}, options)
        record = records[payload["id"]]
        got = {name: record.get(name) for name in want}
        assert got == want, (payload["id"], {k: (got[k], want[k]) for k in want
                                             if got[k] != want[k]})
        assert ("reasoning" in record) == bool(payload.get("think"))
        assert ("logprobs" in record) == bool(payload.get("logprobs"))
        assert ("json_error" in record) == (record.get("json_valid") is False)
        wanted_counts["empty"] += not record["completion"].strip()
        wanted_counts["reasoning_unfinished"] += record.get("reasoning_unfinished") is True
        wanted_counts["json_invalid"] += record.get("json_valid") is False

    by_kind = {kind: [records[p["id"]] for p in sent if p["row"]["kind"] == kind]
               for kind in KINDS}
    # The shapes each kind must have, beyond equality with the model:
    for r in by_kind["thinks"] + by_kind["logprobs"]:
        assert r["reasoning"] and r["completion"] and r["reasoning_tokens"] > 2
        assert "<think>" not in r["completion"] and "</think>" not in r["reasoning"]
    for r in by_kind["opened"]:
        assert r["reasoning"] and r["completion"] and not r["reasoning_unfinished"]
    for r in by_kind["off"]:
        assert r["reasoning"] is None and r["reasoning_tokens"] == 0 and r["completion"]
    for r in by_kind["cut"]:
        assert r["reasoning_unfinished"] and r["completion"] == "" and r["reasoning_tokens"] == 6
        assert r["finish_reason"] == "length"
    for r in by_kind["think-json"]:
        assert r["reasoning"], "the grammar waited for </think> (require_reasoning)"
    for r in by_kind["off-json"]:
        assert r["reasoning"] is None and r["completion"].startswith("{"), \
            "the grammar held from the first token (no require_reasoning on a closed block)"
    for r in by_kind["logprobs"]:
        logprobs = r["logprobs"]
        assert len(logprobs["ids"]) == r["completion_tokens"] == len(logprobs["top_ids"])
        assert {len(row) for row in logprobs["top_lp"]} == {4}
    for r in by_kind["plain"]:
        # Not split: Qwen3.6's tags are not special tokens, so the answer keeps them whole.
        assert "reasoning" not in r and r["completion"].startswith("<think>\n")
    assert wanted_counts["reasoning_unfinished"] == PER_KIND
    assert 0 < wanted_counts["json_invalid"] < 3 * PER_KIND, "--json-invalid-rate 0.5 shows"

    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[k] for k in wanted_counts} == wanted_counts
    stats = read_hash(client, keys.stats)
    assert {k: int(stats.get(k, 0)) for k in wanted_counts} == wanted_counts
    # A restarted drainer rebuilds the counts from its files alone.
    again = Drainer(connect(redis_url), RUN, out)
    again.recover()
    again.close()
    assert {k: again.counts()[k] for k in wanted_counts} == wanted_counts
