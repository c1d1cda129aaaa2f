"""Pure parts of the simulator: config validation and the deterministic model."""

from __future__ import annotations

import statistics

import pytest

from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.model import (
    STOP_TOKEN_ID,
    VOCAB_SIZE,
    count_text_tokens,
    generate,
    request_key,
    tokens_done,
)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"context_length": 4}, "context_length"),
        ({"max_running_requests": 0}, "max_running_requests"),
        ({"max_queued_requests": -1}, "max_queued_requests"),
        ({"speed": 0}, "speed"),
        ({"tpot_ms": -1}, "tpot_ms"),
        ({"error_rate": 1.5}, "error_rate"),
        ({"drop_rate": -0.1}, "drop_rate"),
        ({"error_rate": 0.6, "hang_rate": 0.6}, "error_rate"),
        ({"down_windows": [(5, 2)]}, "down_windows"),
        ({"die_after_s": -1}, "die_after_s"),
        ({"port": 65535, "count": 2}, "count"),
        ({"output_tokens_mean": 0}, "output_tokens_mean"),
        ({"speculative_algorithm": "MEDUSA"}, "speculative_algorithm"),
        ({"max_running_requests": 1, "dp_size": 2}, "max_running_requests"),
        ({"health_delay_s": -1}, "health_delay_s"),
        ({"derived_slots": 0}, "derived_slots"),
    ],
)
def test_invalid_config_names_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=rf"SimConfig\.{field} "):
        SimConfig(**overrides)  # type: ignore[arg-type]


def test_api_key_is_hidden_from_repr() -> None:
    config = SimConfig(api_key="s3cret-key")
    assert "s3cret-key" not in repr(config)
    assert config.api_key == "s3cret-key"


def test_limits_follow_the_scheduler_formula() -> None:
    assert SimConfig(context_length=8192).max_req_len == 8191
    assert SimConfig(context_length=8192).max_req_input_len == 8186
    kv_bound = SimConfig(context_length=8192, max_total_tokens=4096)
    assert (kv_bound.max_req_len, kv_bound.max_req_input_len) == (4095, 4090)


def test_down_windows_are_stored_as_a_tuple() -> None:
    assert SimConfig(down_windows=[(1, 2)]).down_windows == ((1.0, 2.0),)


def test_text_token_count_is_words_and_punctuation() -> None:
    assert count_text_tokens("Hello, world!") == 4
    assert count_text_tokens("   ") == 0


def test_same_key_same_answer_and_shorter_limit_gives_a_prefix() -> None:
    key = request_key(0, [1, 2, 3])
    long = generate(key, 256, 100_000)
    assert long == generate(key, 256, 100_000)
    assert long.finish_reason == {"type": "stop", "matched": STOP_TOKEN_ID}
    # The stop token ends the ids and counts; the text is the words before it.
    assert long.output_ids[-1] == STOP_TOKEN_ID
    assert len(long.text.split(" ")) == long.completion_tokens - 1
    exact = generate(key, 256, long.completion_tokens)
    assert exact == long
    cut = generate(key, 256, long.completion_tokens - 1)
    assert cut.finish_reason == {"type": "length", "length": long.completion_tokens - 1}
    assert cut.output_ids == long.output_ids[:-1] and cut.text == long.text
    shorter = generate(key, 256, long.completion_tokens - 2)
    assert shorter.output_ids == long.output_ids[:-2] and long.text.startswith(shorter.text)
    assert all(0 <= token < VOCAB_SIZE for token in cut.output_ids)


def test_key_depends_on_seed_prompt_and_sample() -> None:
    keys = {
        request_key(0, [1, 2, 3]),
        request_key(1, [1, 2, 3]),
        request_key(0, [1, 2, 4]),
        request_key(0, [1, 2, 3], 1),
        request_key(0, "1 2 3"),
    }
    assert len(keys) == 5


def test_lengths_are_heavy_tailed_around_the_mean() -> None:
    lengths = [generate(request_key(7, [i]), 200, 10**7).completion_tokens for i in range(3000)]
    assert 180 <= statistics.fmean(lengths) <= 220
    assert statistics.median(lengths) < 0.75 * statistics.fmean(lengths)  # a long right tail
    assert min(lengths) >= 1


def test_min_new_tokens_and_ignore_eos() -> None:
    key = request_key(0, [5])
    natural = generate(key, 4, 1000).completion_tokens
    # The stop token is held back until min_new_tokens came, then ends the answer.
    held = generate(key, 4, 1000, min_new_tokens=natural + 10)
    assert held.completion_tokens == natural + 11 and held.output_ids[-1] == STOP_TOKEN_ID
    forced = generate(key, 4, 50, ignore_eos=True)
    assert forced.completion_tokens == 50
    assert forced.finish_reason == {"type": "length", "length": 50}


def test_tokens_done_counts_partial_output() -> None:
    assert tokens_done(0.01, first_s=0.05, each_s=0.01, total=100) == 0
    assert tokens_done(0.05, first_s=0.05, each_s=0.01, total=100) == 1
    assert tokens_done(0.5, first_s=0.05, each_s=0.01, total=100) == 46
    assert tokens_done(9.0, first_s=0.05, each_s=0.01, total=100) == 100
