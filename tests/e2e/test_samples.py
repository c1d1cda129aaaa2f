"""`--n` samples per prompt end to end through the real CLI: one result line per (id, sample),
each the simulator's answer under that sample's own seed, exactly once, and a run that counts
requests (rows x n) in its total and its summary."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import jsonschema
import orjson

from fleetgen.local.fleet import LocalFleet
from tests.support.cli import fleetgen
from tests.support.content import assert_fleet_content
from tests.support.pipeline import assert_exactly_once, write_jsonl

ROWS, SAMPLES = 10, 3
COLOURS = {"type": "object", "properties": {"colours": {"type": "array",
                                                        "items": {"type": "string"}}},
           "required": ["colours"]}


def test_n_samples_each_with_its_own_seed_exactly_once(fleet2: LocalFleet,
                                                       tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": f"r{i}", "messages": [{"role": "user", "content": f"Tell me about {i}."}]}
        for i in range(ROWS)])
    out = tmp_path / "out"
    produce = ("produce", str(prompts), "--run", "samples", "--context-length", "8192",
               "--max-output-tokens", "128", "--n", str(SAMPLES), "--temperature", "0.8",
               "--seed", "11", "--redis", fleet2.redis_url)
    fleetgen(*produce)
    fleetgen("drain", "--run", "samples", "--out", str(out), "--redis", fleet2.redis_url)
    data = assert_exactly_once(out, {f"r{i}#{k}" for i in range(ROWS) for k in range(SAMPLES)})
    assert assert_fleet_content(fleet2, prompts, data, sampling={"seed": 11}) == ROWS * SAMPLES
    # The whole answer: a thinking answer cut inside its reasoning has no completion yet.
    by_row: dict[str, set[tuple[str | None, str]]] = defaultdict(set)
    for result in data["results"]:
        by_row[result["id"]].add((result.get("reasoning"), result["completion"]))
    different = sum(len(answers) == SAMPLES for answers in by_row.values())
    assert different == ROWS, f"only {different} of {ROWS} rows got {SAMPLES} distinct samples"
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert (summary["total"], summary["done"], summary["complete"]) == (30, 30, True)
    # The same commands again: nothing is generated or written twice.
    again = fleetgen(*produce)
    assert "already complete" in again.stdout
    fleetgen("drain", "--run", "samples", "--out", str(out), "--redis", fleet2.redis_url)
    assert_exactly_once(out, {f"r{i}#{k}" for i in range(ROWS) for k in range(SAMPLES)})


def test_batch_lines_bring_their_own_options(fleet2: LocalFleet, tmp_path: Path) -> None:
    """An OpenAI Batch body's max_tokens, seed and n are honoured inside the run's budget, an
    option fleetgen cannot honour rejects the line by name, and `export --format openai-batch`
    gives the samples back as the line's choices."""
    chat = {"messages": [{"role": "user", "content": "Name two colours."}]}
    lines = [
        {"custom_id": "b1", "method": "POST", "url": "/v1/chat/completions",
         "body": {**chat, "max_tokens": 20, "seed": 3, "n": 2, "temperature": 0.9}},
        {"custom_id": "b2", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "Once upon a time", "max_completion_tokens": 500}},
        {"custom_id": "b3", "method": "POST", "url": "/v1/chat/completions",
         "body": {**chat, "tools": [{"type": "function"}]}},
        {"custom_id": "b4", "method": "POST", "url": "/v1/chat/completions",
         "body": {**chat, "response_format": {"type": "json_schema", "json_schema": {
             "name": "colours", "schema": COLOURS}}}},
    ]
    prompts = write_jsonl(tmp_path / "batch.jsonl", lines)
    out = tmp_path / "out"
    fleetgen("produce", str(prompts), "--run", "batch", "--context-length", "8192",
             "--max-output-tokens", "64", "--redis", fleet2.redis_url)
    fleetgen("drain", "--run", "batch", "--out", str(out), "--redis", fleet2.redis_url)
    data = assert_exactly_once(out, {"b1#0", "b1#1", "b2", "b3", "b4"})
    # b1 with its own seed per sample, b4 under its response_format's schema
    assert assert_fleet_content(fleet2, prompts, data, options={}) == 4
    budgets = {(r["id"], r.get("sample")): r["max_tokens"] for r in data["results"]}
    assert budgets == {("b1", 0): 20, ("b1", 1): 20, ("b2", None): 64, ("b4", None): 64}
    (b4,) = (r for r in data["results"] if r["id"] == "b4")
    assert b4["json_valid"] is True
    jsonschema.validate(orjson.loads(b4["completion"]), COLOURS)
    (rejected,) = data["rejected"]
    assert rejected["reason"].startswith("unsupported_option: body.tools")
    export = tmp_path / "batch-out.jsonl"
    fleetgen("export", str(out), "--format", "openai-batch", "--out", str(export))
    exported = {line["custom_id"]: line for line in map(orjson.loads, export.read_bytes()
                                                        .splitlines())}
    choices = exported["b1"]["response"]["body"]["choices"]
    by_sample = {r["sample"]: r["completion"] for r in data["results"] if r["id"] == "b1"}
    assert [c["message"]["content"] for c in choices] == [by_sample[0], by_sample[1]]
    assert exported["b3"]["error"]["code"] and exported["b3"]["response"]["status_code"] == 400
