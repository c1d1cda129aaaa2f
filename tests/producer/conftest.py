"""Producer tests read a server's limits from small simulated answers; the tokenizer tests
share one offline build of Qwen3.6's tokenizer (~10 CPU-seconds each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.tokenizer import QwenTokenizer, load_tokenizer
from tests.support.sim import StartSim


@pytest.fixture
def start_sim(start_sim: StartSim) -> StartSim:
    """The suite's simulated servers, with short answers unless a test says otherwise."""
    return lambda **overrides: start_sim(**{"output_tokens_mean": 8, **overrides})


@pytest.fixture(scope="session")
def built_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> QwenTokenizer:
    """Qwen3.6's tokenizer built once, from nothing, into a cache of its own (not the
    user's ~/.cache): the first load of `built_tokenizer.cache_path.parent`."""
    cache: Path = tmp_path_factory.mktemp("tokenizer-cache")
    loaded = load_tokenizer("qwen3.6", cache)
    assert isinstance(loaded, QwenTokenizer) and not loaded.from_cache
    return loaded
