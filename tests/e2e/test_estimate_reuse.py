"""`fleetgen run` after `fleetgen estimate` writes the estimate's answers as its own where they
stand for its requests (producer/reuse.py, docs/plan.md): only the other rows reach a server,
every id is in the output once, summary.json counts them as `reused`; a run with other
sampling reuses nothing and says why; the same estimate again starts no Valkey and no worker.
Real parts: the simulator over HTTP (its /metrics count the generations), `fleetgen` as the
user types it (its Valkey, its Celery workers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from fleetgen.local.simgpus import SimGpus
from tests.support.cli import fleetgen_in as fleetgen
from tests.support.pipeline import make_prompts
from tests.support.sims import engine_flags, requests_answered, sims_fixture

SIMS = SimGpus(gpus=2, context_length=4096, max_running_requests=16, ttft_ms=1.0,
               tpot_ms=0.05, output_tokens_mean=120)
ROWS = 60
SAMPLE = 40

urls = sims_fixture(SIMS)



def results(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in (out / "results.jsonl").read_bytes().splitlines()]


def test_a_run_after_the_estimate_sends_only_the_rows_it_did_not_answer(
        urls: list[str], tmp_path: Path) -> None:
    make_prompts(tmp_path / "p.jsonl", ROWS)
    servers = engine_flags(urls)
    fleetgen(tmp_path, "estimate", "p.jsonl", *servers, "--sample", str(SAMPLE))
    (sample,) = (tmp_path / ".fleetgen-estimate").glob("*/run")
    earlier = {r["id"]: r for r in results(sample)}
    assert len(earlier) == SAMPLE

    # The same estimate again: its sample is all answered, so nothing starts (no Valkey, no
    # worker: the job's "starting run" line is never said) and nothing is generated.
    asked = requests_answered(urls)
    again = fleetgen(tmp_path, "estimate", "p.jsonl", *servers, "--sample", str(SAMPLE))
    assert requests_answered(urls) == asked
    assert "starting run" not in again.stdout and "workers" not in again.stdout, again.stdout
    assert "nothing is generated" in again.stdout

    # The run, with the same settings: the 40 answers are its own, only 20 rows are sent
    # (besides the pre-flight's probes, counted below by a run that reuses nothing).
    asked = requests_answered(urls)
    ran = fleetgen(tmp_path, "run", "p.jsonl", *servers, "--out", "out")
    sent = requests_answered(urls) - asked
    out = results(tmp_path / "out")
    assert sorted(r["id"] for r in out) == sorted(f"p{i}" for i in range(ROWS))  # once each
    reused = {r["id"]: r for r in out if r.get("reused")}
    assert set(reused) == set(earlier)
    for row_id, record in reused.items():
        assert record["completion"] == earlier[row_id]["completion"]
        assert record["reused"] == str(sample) and record["line"] == int(row_id[1:]) + 1
    summary = orjson.loads((tmp_path / "out/summary.json").read_bytes())
    assert summary["reused"] == SAMPLE and summary["done"] == ROWS and summary["complete"]
    assert f"{SAMPLE:,} answers of the estimate in {sample} are reused" in ran.stdout
    assert f"{SAMPLE} of the {ROWS} answers are the estimate's" in ran.stdout

    # Another temperature: the estimate's answers are not this run's; one line says why.
    asked = requests_answered(urls)
    other = fleetgen(tmp_path, "run", "p.jsonl", *servers, "--out", "hot", "--temperature",
                     "0.5")
    probes = requests_answered(urls) - asked - ROWS
    print(f"\nrequests sent by the run: {sent:.0f} after the estimate, {ROWS + probes:.0f} "
          f"with another temperature ({probes:.0f} of them the pre-flight's probes)")
    assert 0 <= probes <= 8 * len(urls) and sent == ROWS - SAMPLE + probes
    assert not any(r.get("reused") for r in results(tmp_path / "hot"))
    assert (f"the estimate's answers in {sample} are not reused: the estimate ran with "
            'sampling options {}, this run with {"temperature":0.5}') in other.stdout


def test_a_cap_reuses_only_the_answers_that_end_within_it(urls: list[str],
                                                          tmp_path: Path) -> None:
    """An answer longer than the run's --max-output-tokens is not the capped run's answer:
    its row is sent, and the reused ones all stopped by themselves within the cap."""
    make_prompts(tmp_path / "p.jsonl", ROWS)
    servers = engine_flags(urls)
    fleetgen(tmp_path, "estimate", "p.jsonl", *servers, "--sample", str(SAMPLE))
    (sample,) = (tmp_path / ".fleetgen-estimate").glob("*/run")
    cap = 100
    fits = {r["id"] for r in results(sample)
            if r["finish_reason"] == "stop" and r["completion_tokens"] <= cap}
    assert 0 < len(fits) < SAMPLE, "the simulator's answers no longer straddle the cap"
    asked = requests_answered(urls)
    ran = fleetgen(tmp_path, "run", "p.jsonl", *servers, "--out", "out",
                   "--max-output-tokens", str(cap))
    sent = requests_answered(urls) - asked
    out = results(tmp_path / "out")
    assert len(out) == ROWS == len({r["id"] for r in out})
    assert {r["id"] for r in out if r.get("reused")} == fits
    assert all(r["max_tokens"] <= cap for r in out)
    assert f"{SAMPLE - len(fits)} longer than this run's budget" in ran.stdout
    # The same run told to reuse nothing sends every row: the difference is the reused ones.
    asked = requests_answered(urls)
    fleetgen(tmp_path, "run", "p.jsonl", *servers, "--out", "none", "--max-output-tokens",
             str(cap), "--reuse-estimate", "none")
    assert requests_answered(urls) - asked - sent == len(fits)
    assert not any(r.get("reused") for r in results(tmp_path / "none"))
