"""Which cached prefix a simulated server reuses: Qwen3.6's hybrid model (SGLang's Mamba radix
cache, vLLM's "align" blocks) by default, a full-attention model's radix or blocks with
`prefix_cache="full"`; and the prompt enters the cache after its prefill, not on admission.

The rules are checked on the cache alone (explicit token ids, no clock), then over HTTP with
the simulator's own counters. The figures are SGLang 0.5.23's and vLLM 0.32's (the rules'
docstrings in fleetgen/simulator/prefix_cache.py; vLLM's from the real server, issue 40).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.model import Completion
from fleetgen.simulator.prefix_cache import (
    Blocks,
    MambaRadix,
    PrefixCache,
    TokenRadix,
    finished_hashes,
    prefix_hashes,
    reuse_for,
)
from tests.support.sim import ENDLESS, StartSim, generate, stats
from tests.support.waiting import wait_until

BIG = 10**7


def served(cache: PrefixCache, prompt: list[int], output: list[int] | None = None) -> int:
    """One request through the cache as the server runs it: match, prefill, finish; returns
    its cached tokens."""
    hashes = prefix_hashes(prompt)
    hit = cache.lookup(hashes)
    cache.after_prefill(hashes, hit)
    if output is not None:
        done = Completion(" ".join(map(str, output)), output, {"type": "stop"})
        cache.after_decode(finished_hashes(hashes, prompt, done), len(hashes))
    return hit.cached


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


# ------------------------------------------------------------ SGLang, the hybrid model


def test_a_repeated_prompt_is_reused_up_to_the_prefills_last_64_token_state() -> None:
    cache = PrefixCache(BIG, MambaRadix())
    prompt = tokens(0, 4000)
    assert served(cache, prompt) == 0
    # One state per extend, at prefix_len + extend_len // 64 * 64 (not 3,999 as a radix
    # tree of attention KV would give).
    assert served(cache, prompt) == 3968
    assert served(PrefixCache(BIG, MambaRadix()), tokens(0, 40)) == 0  # under one grid step
    short = PrefixCache(BIG, MambaRadix())
    served(short, tokens(0, 40))
    assert served(short, tokens(0, 40)) == 0


def test_a_chunked_prefill_keeps_a_state_at_each_chunk() -> None:
    """Chunks of 1,000 tokens end at 1,000, 2,000 and 2,500; each keeps its state at its own
    start + its length // 64 * 64 (without DCP the grid is relative to the chunk's prefix):
    960, 1,960 and 2,448."""
    cache = PrefixCache(BIG, MambaRadix(chunked_prefill_size=1000))
    served(cache, tokens(0, 2500))
    assert served(cache, [*tokens(0, 1500), *tokens(90_000, 100)]) == 960
    assert served(cache, [*tokens(0, 2300), *tokens(80_000, 100)]) == 1960
    assert served(cache, tokens(0, 2500)) == 2448


def test_a_prompt_sharing_part_of_a_cached_one_keeps_a_state_where_it_branches() -> None:
    """The tree holds the first 300 tokens but no state inside them: the second prompt gets
    none, keeps its state at the branching point (256, the last 64-multiple of the full-KV
    hit), and the third, sharing the same 300 tokens, starts there."""
    cache = PrefixCache(BIG, MambaRadix())
    shared = tokens(0, 300)
    served(cache, [*shared, *tokens(10_000, 500)])
    assert served(cache, [*shared, *tokens(20_000, 500)]) == 0
    assert served(cache, [*shared, *tokens(30_000, 500)]) == 256


def test_decoding_keeps_a_state_every_256_tokens_and_the_finished_request_donates_the_last(
) -> None:
    cache = PrefixCache(BIG, MambaRadix())
    prompt, output = tokens(0, 100), tokens(5000, 500)  # kept KV: 100 + 499 = 599 tokens
    served(cache, prompt, output)
    next_turn = [*prompt, *output, *tokens(7000, 50)]
    # The states: 64 (the prefill's), 512 (decoding's last multiple of 256 within 599).
    assert served(cache, next_turn) == 512
    # A short answer passes no multiple of 256: only the prefill's state is in the tree.
    cache = PrefixCache(BIG, MambaRadix())
    served(cache, prompt, tokens(5000, 50))
    assert served(cache, [*prompt, *tokens(5000, 50), *tokens(7000, 50)]) == 64


def test_the_grid_follows_the_page_size_and_the_track_interval() -> None:
    assert (MambaRadix().grid, MambaRadix().track_grid) == (64, 256)
    assert (MambaRadix(page_size=128).grid, MambaRadix(page_size=128).track_grid) == (128, 256)
    assert MambaRadix(track_interval=1024).track_grid == 1024


# ------------------------------------------------------------ vLLM


def test_vllm_reuses_whole_blocks_and_a_hybrid_model_only_its_aligned_states() -> None:
    """The real vLLM 0.32 on CPU (issue 40): a repeated 259-token prompt 256 cached, a 91-token
    one 0; the hybrid model in "align" mode with 640-token blocks, 259 tokens: 0."""
    full = PrefixCache(BIG, Blocks(128))
    for prompt, expected in ((tokens(0, 259), 256), (tokens(1000, 91), 0)):
        served(full, prompt)
        assert served(full, prompt) == expected
    hybrid = PrefixCache(BIG, Blocks(640, align=True))
    served(hybrid, tokens(0, 259))
    assert served(hybrid, tokens(0, 259)) == 0
    served(hybrid, tokens(0, 2000))  # one state, at (2000 - 1) // 640 * 640
    assert served(hybrid, tokens(0, 2000)) == 1920
    assert served(hybrid, [*tokens(0, 1000), *tokens(50_000, 10)]) == 0  # no state at 640
    assert served(full, [*tokens(0, 259), *tokens(50_000, 10)]) == 256


def test_the_rule_follows_the_flavour_and_the_model() -> None:
    assert isinstance(reuse_for(SimConfig()), MambaRadix)  # Qwen3.6's: the default
    assert isinstance(reuse_for(SimConfig(prefix_cache="full")), TokenRadix)
    assert reuse_for(SimConfig(flavor="vllm")) == Blocks(640, align=True)
    assert reuse_for(SimConfig(flavor="vllm", prefix_cache="full")) == Blocks(128)
    assert reuse_for(SimConfig(flavor="vllm", cache_block_size=16,
                               prefix_cache="full")) == Blocks(16)
    with pytest.raises(ValueError, match="prefix_cache"):
        SimConfig(prefix_cache="radix")


# ------------------------------------------------------------ over HTTP


def test_a_qwen36_server_reuses_a_repeated_prompt_from_its_last_state(
    start_sim: StartSim,
) -> None:
    sim = start_sim(prefill_tokens_per_s=1e6, context_length=16384)  # the default cache
    prompt = [7, *tokens(1000, 3999)]
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        first = generate(client, prompt, 1).json()["meta_info"]
        computed = stats(client)["prefill_tokens_total"]
        again = generate(client, prompt, 1).json()["meta_info"]
        assert stats(client)["prefill_tokens_total"] - computed == 4000 - 3968
    assert (first["cached_tokens"], again["cached_tokens"]) == (0, 3968)


def test_a_prompt_enters_the_cache_after_its_prefill_not_on_admission(
    start_sim: StartSim,
) -> None:
    """Two copies of a long prompt: the second arrives while the first is still prefilling
    (0.5 s at 10,000 tokens/s), so nothing of it is in the tree yet and it is computed in
    full; a third, after both, is cached. On admission (the simulator before), the second
    had 4,999 cached."""
    sim = start_sim(prefill_tokens_per_s=10_000, context_length=16384, prefix_cache="full",
                    output_tokens_mean=ENDLESS)
    prompt = [9, *tokens(1000, 4999)]
    with httpx.Client(base_url=sim.url, timeout=30) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(generate, client, prompt, 1)
        wait_until(lambda: stats(client)["num_running_reqs"] == 1, what="the first prefilling")
        second = generate(client, prompt, 1).json()["meta_info"]
        assert first.result().json()["meta_info"]["cached_tokens"] == 0
        third = generate(client, prompt, 1).json()["meta_info"]
    assert second["cached_tokens"] == 0
    assert third["cached_tokens"] == 4999


@pytest.mark.parametrize(("prefix_cache", "repeats"), [
    ("full", {259: 256, 91: 0}), ("hybrid", {259: 0, 1300: 1280}),
])
def test_the_vllm_flavour_caches_whole_blocks(start_sim: StartSim, prefix_cache: str,
                                              repeats: dict[int, int]) -> None:
    sim = start_sim(flavor="vllm", prefix_cache=prefix_cache, context_length=4096)
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        for length, expected in repeats.items():
            body = {"model": "fleetgen-sim", "prompt": tokens(10 * length, length),
                    "max_tokens": 1}
            client.post("/v1/completions", json=body).raise_for_status()
            before = stats(client)["cached_tokens_total"]
            client.post("/v1/completions", json=body).raise_for_status()
            assert stats(client)["cached_tokens_total"] - before == expected, length
