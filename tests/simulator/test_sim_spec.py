"""`fleetgen sim --speculative-algorithm`: a finished answer's meta_info carries SGLang 0.5.23's
speculative fields (`_calculate_spec_decoding_metrics`), the acceptance follows the server's
`--spec-accept-rate` and the prompt, decoding takes one step per verify, and the vLLM flavour
counts the same steps on /metrics as vLLM's spec_decode counters."""

from __future__ import annotations

import argparse
import re
import statistics
from typing import Any

import httpx
import pytest

from fleetgen.simulator.cli import add_arguments, config_from_args
from tests.support.sim import ENDLESS, StartSim, generate

PROMPTS = [[7 + i, 100 + 3 * i, 200 + i, 42] for i in range(24)]


def spec_meta(client: httpx.Client, prompt: list[int], max_new_tokens: int) -> dict[str, Any]:
    response = generate(client, prompt, max_new_tokens)
    assert response.status_code == 200, response.text
    return response.json()["meta_info"]


def test_meta_info_fields_are_consistent_as_sglang_computes_them(start_sim: StartSim) -> None:
    sim = start_sim(speculative_algorithm="EAGLE3", speculative_num_steps=3,
                    speculative_num_draft_tokens=4, output_tokens_mean=ENDLESS)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        meta = spec_meta(client, PROMPTS[0], 300)
    steps, tokens = meta["spec_verify_ct"], meta["completion_tokens"]
    assert isinstance(steps, int) and isinstance(tokens, int) and tokens == 300
    assert meta["spec_accept_length"] == tokens / steps
    assert meta["spec_num_proposed_drafts"] == steps * 3  # verify_ct x (draft tokens - 1)
    assert meta["spec_accept_rate"] == meta["spec_num_correct_drafts"] / (steps * 3)
    histogram = meta["spec_correct_drafts_histogram"]
    assert isinstance(histogram, list) and sum(histogram) == steps
    assert sum(i * n for i, n in enumerate(histogram)) == meta["spec_num_correct_drafts"]
    # The first token is the prefill's; each step gives 1 + its correct drafts, the last cut.
    assert steps + meta["spec_num_correct_drafts"] >= tokens - 1 > steps + \
        meta["spec_num_correct_drafts"] - 1 - 3
    assert list(meta)[-6:] == ["spec_accept_rate", "spec_accept_length",
                               "spec_num_correct_drafts", "spec_num_proposed_drafts",
                               "spec_verify_ct", "spec_correct_drafts_histogram"]


def test_acceptance_follows_the_server_rate_and_varies_by_prompt(start_sim: StartSim) -> None:
    rates: dict[float, list[float]] = {}
    for rate in (0.3, 0.8):
        sim = start_sim(speculative_algorithm="EAGLE3", spec_accept_rate=rate,
                        output_tokens_mean=ENDLESS)
        with httpx.Client(base_url=sim.url, timeout=10) as client:
            rates[rate] = [float(spec_meta(client, p, 200)["spec_accept_rate"])
                           for p in PROMPTS]
            again = float(spec_meta(client, PROMPTS[0], 200)["spec_accept_rate"])
        assert again == rates[rate][0]  # deterministic per prompt
        assert abs(statistics.mean(rates[rate]) - rate) < 0.1 * rate
        assert len(set(rates[rate])) > len(PROMPTS) // 2  # prompts differ
    # The same prompts are hard on both: a prompt's rank barely moves between the servers.
    low, high = rates[0.3], rates[0.8]
    assert all(h > lo for lo, h in zip(low, high, strict=True))
    hardest = min(range(len(PROMPTS)), key=lambda i: low[i] / 0.3)
    assert high[hardest] / 0.8 < statistics.mean(high) / 0.8


def test_decode_time_follows_the_verify_steps(start_sim: StartSim) -> None:
    # 20 ms a forward pass: 200 tokens take 4 s without speculation; with it, verify_ct passes.
    sim = start_sim(speculative_algorithm="EAGLE3", spec_accept_rate=0.9, ttft_ms=0,
                    tpot_ms=20, output_tokens_mean=ENDLESS)
    with httpx.Client(base_url=sim.url, timeout=20) as client:
        meta = spec_meta(client, PROMPTS[1], 200)
    latency, steps = float(meta["e2e_latency"]), int(meta["spec_verify_ct"])
    assert steps < 100
    # Below what 200 passes take (4 s): the slack is their difference, seconds, which a
    # loaded machine stalling the simulator (CI: 1 s) cannot eat, where a fixed 1 s could be.
    assert steps * 0.020 <= latency < 200 * 0.020, (steps, latency)


def test_no_spec_fields_without_an_algorithm(start_sim: StartSim) -> None:
    sim = start_sim(output_tokens_mean=ENDLESS)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        meta = spec_meta(client, PROMPTS[0], 50)
    assert not [k for k in meta if k.startswith("spec_")]


@pytest.mark.parametrize(("algorithm", "drafts"), [("DFLASH", 16), ("NGRAM", 12), ("EAGLE", 4)])
def test_cli_resolves_the_draft_tokens_as_sglang(algorithm: str, drafts: int) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(
        ["--speculative-algorithm", algorithm, "--spec-accept-rate", "0.4"]))
    assert config.speculative_num_draft_tokens == drafts
    assert config.spec_accept_rate == 0.4
    # Only the EAGLE family keeps drafts in the output slots (compute_num_reserved_tokens).
    assert (config.num_reserved_tokens > 0) == (algorithm == "EAGLE")


def test_a_bad_rate_is_refused_naming_the_field() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="spec_accept_rate"):
        config_from_args(parser.parse_args(["--spec-accept-rate", "1.5"]))


def counter(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def test_vllm_flavour_counts_the_steps_on_metrics(start_sim: StartSim) -> None:
    sim = start_sim(flavor="vllm", speculative_algorithm="EAGLE3", spec_accept_rate=0.5,
                    output_tokens_mean=ENDLESS)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        for prompt in PROMPTS[:4]:
            response = client.post("/v1/completions", json={"model": "m", "prompt": prompt,
                                                             "max_tokens": 120})
            assert response.status_code == 200
            assert "spec" not in str(response.json()["choices"][0])  # no per-request figures
        text = client.get("/metrics").text
    drafts = counter(text, "vllm:spec_decode_num_drafts_total")
    accepted = counter(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert counter(text, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    per_pos = [float(v) for v in re.findall(
        r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="\d+"\} (\S+)$',
        text, re.M)]
    assert len(per_pos) == 3
    assert sum(per_pos) == accepted and per_pos[0] >= per_pos[1] >= per_pos[2]
    # 4 answers of 120 tokens: every token but each answer's first from a verify step.
    assert drafts + accepted >= 4 * 119 > drafts + accepted - 4 * 4
