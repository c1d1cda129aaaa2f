"""A whole run on a fleet with speculative decoding: the producer reads the reserve from the
servers, so real workers send no request the servers refuse (no 400, no correction)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.content import assert_fleet_content
from tests.support.fleet import sim_fleet
from tests.support.pipeline import assert_exactly_once, make_prompts, run_pipeline

# SGLang reserves max(topk x steps, draft tokens) = max(2 x 4, 6) = 8 tokens of every request
# (srt/managers/utils.py `compute_num_reserved_tokens`).
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "4",
         "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]


def test_a_speculative_fleet_gets_no_request_it_refuses(tmp_path: Path) -> None:
    fleet = sim_fleet(tmp_path / "fleet", gpus=2, context_length=4096, max_running_requests=8,
                      ttft_ms=1, tpot_ms=0.02, output_tokens_mean=40,
                      gpu_sim_args={0: EAGLE, 1: EAGLE})
    fleet.start()
    try:
        kinds = make_prompts(tmp_path / "p.jsonl", 40)
        summary = run_pipeline(fleet, tmp_path / "p.jsonl", "spec", tmp_path / "out",
                               context_length=None,
                               engine_url=tuple(fleet.engine_url(g) for g in range(2)))
        data = assert_exactly_once(tmp_path / "out", set(kinds["good"]))
        stats = [httpx.get(fleet.engine_url(g) + "/_sim/stats", timeout=5).json()
                 for g in range(2)]
        # Each answer is the simulator's own for its ids and budget (the reserve counts in
        # the checks, not in prompt_tokens).
        assert assert_fleet_content(fleet, tmp_path / "p.jsonl", data) == 40
    finally:
        fleet.stop()
    assert summary["complete"] and len(data["results"]) == 40, summary
    refused = sum(s["requests_total"].get("400", 0) for s in stats)
    answered = sum(s["requests_total"].get("200", 0) for s in stats)
    assert (refused, answered) == (0, 40), stats
