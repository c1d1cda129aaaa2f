"""`--n` samples per prompt end to end through the real CLI: one result line per (id, sample),
each the simulator's answer under that sample's own seed, exactly once, and a run that counts
requests (rows x n) in its total and its summary."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import orjson

from fleetgen.local.fleet import LocalFleet
from tests.e2e.content import assert_fleet_content
from tests.e2e.pipeline import assert_exactly_once
from tests.e2e.test_formats import fleetgen, write_jsonl

ROWS, SAMPLES = 10, 3


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
    by_row: dict[str, set[str]] = defaultdict(set)
    for result in data["results"]:
        by_row[result["id"]].add(result["completion"])
    different = sum(len(answers) == SAMPLES for answers in by_row.values())
    assert different == ROWS, f"only {different} of {ROWS} rows got {SAMPLES} distinct samples"
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert (summary["total"], summary["done"], summary["complete"]) == (30, 30, True)
    # The same commands again: nothing is generated or written twice.
    again = fleetgen(*produce)
    assert "already complete" in again.stdout
    fleetgen("drain", "--run", "samples", "--out", str(out), "--redis", fleet2.redis_url)
    assert_exactly_once(out, {f"r{i}#{k}" for i in range(ROWS) for k in range(SAMPLES)})
