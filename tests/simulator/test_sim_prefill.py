"""Prefill costs the uncached prompt tokens, in chunks, and holds back the running batch.

The lane and the cache are checked on their own clocks (explicit times, no waiting); over
HTTP the figures are the simulator's own counters, and wall time only as lower bounds (a
loaded machine makes a sleep longer, never shorter) or generous ratios.
"""

from __future__ import annotations

import argparse
import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fleetgen.local.simgpus import SimGpus
from fleetgen.simulator.cli import PREFILL_TOKENS_PER_S, add_arguments, config_from_args
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.model import Completion
from fleetgen.simulator.prefill import PrefillLane, chunk_sizes
from fleetgen.simulator.prefix_cache import PrefixCache, finished_hashes, prefix_hashes
from fleetgen.simulator.server import SimServer
from tests.support.sim import ENDLESS, StartSim, generate, stats
from tests.support.waiting import wait_until

# ------------------------------------------------------------ the lane, on its own clock


def test_a_prefill_is_cut_into_chunks_of_the_chunk_size() -> None:
    assert chunk_sizes(20000, 8192) == [8192, 8192, 3616]
    assert chunk_sizes(8192, 8192) == [8192]
    assert chunk_sizes(20000, -1) == [20000]  # SGLang's -1: one forward pass
    assert chunk_sizes(0, 8192) == []


def test_prefill_time_is_the_uncached_tokens_over_the_rate_and_prefills_queue() -> None:
    lane = PrefillLane(tokens_per_s=1000, chunk_tokens=100)
    first = lane.schedule(250, now=10.0)
    assert (first.chunks, first.end_s) == (3, pytest.approx(10.25))
    # Arriving during the first one, the second waits for its last chunk (a serial GPU).
    second = lane.schedule(50, now=10.1)
    assert second.end_s == pytest.approx(10.30)
    assert (lane.tokens_total, lane.chunks_total) == (300, 4)
    assert lane.busy_s_total == pytest.approx(0.30)


def test_chunking_changes_the_passes_not_the_first_order_time() -> None:
    chunked, whole = PrefillLane(1000, 100), PrefillLane(1000, -1)
    assert chunked.schedule(250, 0.0).end_s == pytest.approx(whole.schedule(250, 0.0).end_s)
    assert (chunked.chunks_total, whole.chunks_total) == (3, 1)


def test_a_prefill_holds_back_a_decoding_request_by_its_chunks_time() -> None:
    lane = PrefillLane(tokens_per_s=1000, chunk_tokens=100)
    start = lane.schedule(1, now=0.0)  # a 1-token prompt: decodes from 1 ms on
    done = start.decode_clock_s + 1.0  # one second of decode work
    assert lane.time_at(done) == pytest.approx(1.001)
    lane.schedule(500, now=0.5)  # five chunks, back to back: 0.5 s with no decode step
    assert lane.time_at(done) == pytest.approx(1.501)
    # Half-way through the prefill the decode clock stands still.
    assert lane.decode_clock(0.75) == pytest.approx(lane.decode_clock(0.5))


def test_a_free_lane_charges_nothing() -> None:
    lane = PrefillLane(math.inf, 8192)
    prefill = lane.schedule(100_000, now=5.0)
    assert (prefill.end_s, prefill.decode_clock_s) == (5.0, 5.0)
    assert lane.time_at(6.0) == 6.0 and lane.busy_s_total == 0.0


# ------------------------------------------------------------ the cache


def answer(ids: list[int]) -> Completion:
    return Completion(" ".join(f"w{i}" for i in ids), ids, {"type": "length", "length": 3})


def test_a_finished_request_leaves_its_prompt_and_output_but_the_last_token() -> None:
    cache = PrefixCache(capacity_tokens=1000)
    prompt, output = [1, 2, 3, 4], [50, 51, 52]
    hashes = prefix_hashes(prompt)
    cache.insert(hashes)
    cache.insert(finished_hashes(hashes, prompt, answer(output)))
    next_turn = prompt + output + [9, 9]
    assert cache.match(prefix_hashes(next_turn)) == len(prompt) + len(output) - 1
    assert cache.tokens == 6  # the prompt is inner nodes of the longer sequence


def test_a_text_prompt_next_turn_matches_the_answer_words() -> None:
    cache = PrefixCache(capacity_tokens=1000)
    hashes = prefix_hashes("tell me about bees")
    cache.insert(finished_hashes(hashes, "tell me about bees", answer([5, 6, 7])))
    assert cache.match(prefix_hashes("tell me about bees w5 w6 w7 and ants")) == 6


def test_eviction_counts_distinct_tokens_and_drops_the_least_recently_used() -> None:
    cache = PrefixCache(capacity_tokens=10)
    shared = list(range(6))
    a, b, c = (prefix_hashes([*shared, x, x]) for x in (100, 200, 300))
    cache.insert(a)
    cache.insert(b)
    assert cache.tokens == 10  # 6 shared + 2 + 2, as a radix tree holds them
    cache.insert(a)  # a is used again: b is now the oldest
    cache.insert(c)
    assert cache.match(b) == 6 and cache.match(a) == 7 and cache.match(c) == 7


# ------------------------------------------------------------ over HTTP


def test_ttft_grows_with_uncached_tokens_and_not_with_cached_ones(start_sim: StartSim) -> None:
    # A full-attention model's cache (token by token), so "all but the last token" is the
    # figure; the hybrid's checkpoints: tests/simulator/test_sim_prefix_cache.py.
    sim = start_sim(prefill_tokens_per_s=10_000, context_length=16384, prefix_cache="full")
    long_prompt = [7, *range(1000, 1000 + 3999)]  # 4000 tokens: 0.4 s of prefill
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        short = generate(client, [8, 9, 10], 1).json()["meta_info"]
        first = generate(client, long_prompt, 1).json()["meta_info"]
        computed = stats(client)["prefill_tokens_total"]
        again = generate(client, long_prompt, 1).json()["meta_info"]
        assert stats(client)["prefill_tokens_total"] - computed == 1  # only the last token
        assert stats(client)["cached_tokens_total"] == 3999
        assert ('sglang:cached_tokens_total{model_name="fleetgen-sim",cache_source="device"} '
                '3999.0') in client.get("/metrics").text
        # Each quick answer played twice and judged by the quicker: a stall of the whole
        # simulator on a loaded machine (a fresh-clone make test saw a cached answer take
        # 1.72 s against the uncached 0.71 s) lengthens one answer, not what the cache saves.
        quick = {"cached": min(again["e2e_latency"], latency(client, long_prompt)),
                 "short": min(short["e2e_latency"], latency(client, [8, 9, 10]))}
    assert (first["cached_tokens"], again["cached_tokens"]) == (0, 3999)
    assert first["e2e_latency"] >= 0.39
    assert quick["cached"] < first["e2e_latency"] / 3
    assert quick["short"] < first["e2e_latency"] / 3


def latency(client: httpx.Client, ids: list[int]) -> float:
    return float(generate(client, ids, 1).json()["meta_info"]["e2e_latency"])


def test_a_next_turn_hits_the_cache_with_the_answer_it_extends(start_sim: StartSim) -> None:
    # Token by token (a full-attention model); the hybrid's next turn:
    # tests/simulator/test_sim_prefix_cache.py.
    sim = start_sim(prefill_tokens_per_s=10_000, context_length=16384, output_tokens_mean=60,
                    prefix_cache="full")
    history = [7, *range(1000, 3000)]
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        turn = generate(client, history, 200).json()
        output = turn["output_ids"]
        assert len(output) > 1
        computed = stats(client)["prefill_tokens_total"]
        user = list(range(5000, 5100))
        meta = generate(client, history + output + user, 1).json()["meta_info"]
        new_tokens = stats(client)["prefill_tokens_total"] - computed
    # Everything but the answer's last token (never fed back, so never in KV) is cached.
    assert meta["cached_tokens"] == len(history) + len(output) - 1
    assert new_tokens == len(user) + 1
    # 101 tokens computed, not 2,151: well under the first turn's 2,001 (the first turn's
    # own time is its prefill: tpot is 0).
    assert meta["e2e_latency"] < turn["meta_info"]["e2e_latency"] / 2


def test_a_long_prefill_delays_a_running_request_by_about_its_time(
    start_sim: StartSim,
) -> None:
    sim = start_sim(prefill_tokens_per_s=5_000, tpot_ms=2.0, context_length=16384,
                    output_tokens_mean=ENDLESS)
    # The decoder runs 2 s alone: the long prompt arrives while it runs, even on a loaded
    # machine where the poll and the post take a while.
    decode_s, prefill_s = 1000 * 0.002, 5000 / 5_000
    with httpx.Client(base_url=sim.url, timeout=30) as client, ThreadPoolExecutor(1) as pool:
        running = pool.submit(generate, client, [5, 6, 7], 1000)
        wait_until(lambda: stats(client)["num_running_reqs"] == 1, what="the decoder running")
        long_prompt = generate(client, [9, *range(1000, 1000 + 4999)], 1).json()["meta_info"]
        decoded = running.result().json()["meta_info"]
        assert stats(client)["prefill_chunks_total"] == 2  # 3 tokens, then 5,000 in one
    assert long_prompt["e2e_latency"] >= 0.95 * prefill_s
    # The prefill's second adds to the decoder's two (a lower bound: load only adds).
    assert decoded["e2e_latency"] >= decode_s + 0.9 * prefill_s
    assert decoded["e2e_latency"] < decode_s + prefill_s + 1.5


def test_a_prompt_is_computed_in_chunks_of_the_chunked_prefill_size(
    start_sim: StartSim,
) -> None:
    sim = start_sim(prefill_tokens_per_s=1e6, chunked_prefill_size=1000, context_length=8192)
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        generate(client, [3, *range(100, 2599)], 1).raise_for_status()  # 2,500 tokens
        seen = stats(client)
        assert client.get("/server_info").json()["chunked_prefill_size"] == 1000
    assert (seen["prefill_tokens_total"], seen["prefill_chunks_total"]) == (2500, 3)


# ------------------------------------------------------------ settings


def parsed(*argv: str) -> SimConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_the_command_models_a_27b_on_one_gpu_and_inf_makes_prefill_free() -> None:
    config = parsed()
    assert (config.prefill_tokens_per_s, config.chunked_prefill_size) == (8000.0, 8192)
    assert PREFILL_TOKENS_PER_S == 8000.0
    assert parsed("--prefill-tokens-per-s", "inf").prefill_tokens_per_s == math.inf
    assert SimConfig().prefill_tokens_per_s == math.inf  # the protocol tests' building block


def test_a_slower_gpu_prefills_slower_too() -> None:
    half = SimServer(SimConfig(prefill_tokens_per_s=8000, speed=0.5, chunked_prefill_size=512))
    assert (half.prefill_lane.tokens_per_s, half.prefill_lane.chunk_tokens) == (4000, 512)


@pytest.mark.parametrize("overrides", [
    {"prefill_tokens_per_s": 0}, {"prefill_tokens_per_s": math.nan},
    {"chunked_prefill_size": 0}, {"chunked_prefill_size": -2},
])
def test_bad_prefill_settings_name_the_field(overrides: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(overrides))):
        SimConfig(**overrides)  # type: ignore[arg-type]


def test_local_fleets_prefill_for_free_unless_their_flags_say_otherwise() -> None:
    def config(sims: SimGpus) -> SimConfig:
        # The command line only: no process is started here.
        argv = sims.argv(1, [])
        return parsed(*argv[argv.index("fleetgen.simulator") + 1:])

    assert config(SimGpus()).prefill_tokens_per_s == math.inf
    rated = SimGpus(sim_args=["--prefill-tokens-per-s", "8000"])
    assert config(rated).prefill_tokens_per_s == 8000.0
