"""`fleetgen estimate` against a full run on the simulator: a stratified sample of 300 of 2,000
rows projects the full run's mean output tokens within 15 % and its 4,096-cap cut share within
5 points. The simulator's answers average the seed's ~2,700 tokens (523 M over 193,010
answers): --output-tokens-mean 1,350 for the reasoning and as much for the answer of a thinking
prompt, each lognormal with sigma 1, so a fair share of answers passes 4,096 tokens and some
reach the 8,192-token context: the cut share is then the figure a team needs to choose a cap."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from fleetgen.local.simgpus import SimGpus
from tests.support.cli import fleetgen_cli
from tests.support.cli import fleetgen_in as fleetgen
from tests.support.pipeline import make_prompts
from tests.support.sims import engine_flags, requests_answered, sims_fixture

# Fast servers (2 ms to the first token, 20 µs a token, 32 slots each): the 2,000 rows' ~5 M
# tokens cost the simulator's CPU, not its clock.
SIMS = SimGpus(gpus=4, context_length=8192, max_running_requests=32, ttft_ms=2.0,
               tpot_ms=0.02, output_tokens_mean=1350)
ROWS = 2000
SAMPLE = 300


urls = sims_fixture(SIMS)



def test_a_sample_of_300_projects_the_full_run(urls: list[str], tmp_path: Path) -> None:
    make_prompts(tmp_path / "p.jsonl", ROWS)
    servers = engine_flags(urls)
    shown = fleetgen(tmp_path, "estimate", "p.jsonl", *servers, "--sample", str(SAMPLE))
    assert "--max-output-tokens" in shown.stdout and "4096" in shown.stdout
    est = orjson.loads((tmp_path / "estimate.json").read_bytes())  # the working directory
    assert est["sample"]["answered"] == SAMPLE and est["input"]["rows"] == ROWS
    # The same command again reads its complete sample run (docs/plan.md): no Valkey, no
    # worker, no pre-flight: the servers see no generation at all (6 probes a server before).
    asked = requests_answered(urls)
    second = fleetgen(tmp_path, "estimate", "p.jsonl", *servers, "--sample", str(SAMPLE))
    assert requests_answered(urls) - asked == 0
    assert "is complete: its answers are read again, nothing is generated" in second.stdout
    again = orjson.loads((tmp_path / "estimate.json").read_bytes())
    assert again["output_tokens"] == est["output_tokens"] and again["cut_share"] == est["cut_share"]

    fleetgen(tmp_path, "run", "p.jsonl", *servers, "--out", "out/full")
    results = [orjson.loads(x) for x in (tmp_path / "out/full/results.jsonl")
               .read_bytes().splitlines()]
    assert len(results) == ROWS
    mean = sum(r["completion_tokens"] for r in results) / ROWS
    cut = {cap: sum(r["finish_reason"] == "length" or r["completion_tokens"] > cap
                    for r in results) / ROWS for cap in (2048, 4096, 8192)}
    projected, interval = est["output_tokens"]["mean"], est["output_tokens"]["mean_ci95"]
    print(f"\nestimate --sample {SAMPLE} of {ROWS}: mean output tokens {projected:.0f} "
          f"(95% {interval[0]:.0f}-{interval[1]:.0f}) against {mean:.0f} in the full run; "
          + "; ".join(f"cut by {c}: {est['cut_share'][str(c)]:.3f} "
                      f"(95% {est['by_cap'][str(c)]['cut_share_ci95'][0]:.3f}-"
                      f"{est['by_cap'][str(c)]['cut_share_ci95'][1]:.3f}) against {cut[c]:.3f}"
                      for c in cut))
    assert 0.1 < cut[4096] < 0.4, "the simulator's answers no longer make the cap matter"
    assert abs(projected - mean) <= 0.15 * mean
    assert abs(est["cut_share"]["4096"] - cut[4096]) <= 0.05
    assert set(est["cut_share"]) == {"2048", "4096", "8192"}
    summary = orjson.loads((tmp_path / "out/full/summary.json").read_bytes())
    print(f"projected {est['wall_h'] * 3600:.1f} s of generation on {est['fleet']['slots']} "
          f"slots; the full run took {summary['wall_s']} s (its start and tail included)")
    assert est["wall_h"] > 0 and est["gpu_hours"] == pytest.approx(4 * est["wall_h"], 0.01)
    assert est["output_bytes"]["with_token_ids"] > est["output_bytes"]["without_token_ids"]


@pytest.mark.parametrize(("flag", "needle"), [
    (("--max-output-tokens", "4096"), "generates the sample uncapped"),
    (("--holdout", "0.01"), "drop --holdout"),
    (("--sample", "0"), "--sample must be at least 1"),
])
def test_a_flag_the_estimate_cannot_honour_is_one_line(tmp_path: Path, flag: tuple[str, str],
                                                      needle: str) -> None:
    make_prompts(tmp_path / "p.jsonl", 5)
    done = subprocess.run(fleetgen_cli("estimate", "p.jsonl", "--engine-url",
                                       "http://127.0.0.1:9", *flag),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "estimate.json").exists()
