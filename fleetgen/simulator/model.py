"""The simulated model: token counting, deterministic outputs and service times."""

from __future__ import annotations

import hashlib
import math
import random
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetgen.simulator.config import SimConfig

# Qwen3-style vocabulary bounds: generated ids stay below the special tokens and
# a natural stop reports the end-of-turn id, as a real Qwen3 server would.
VOCAB_SIZE = 248044
STOP_TOKEN_ID = 248046
MAX_INPUT_ID = 2**31 - 1

# Crude tokenizer for `text` prompts: one token per word and per punctuation mark.
# It only has to be stable and roughly proportional to a real tokenizer.
TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# Heavy tail like real completion lengths: lognormal, sigma 1 (mean/median ≈ 1.65).
LENGTH_SIGMA = 1.0

WORDS = (
    "the", "model", "answers", "with", "a", "short", "plain", "sentence", "about",
    "data", "and", "then", "it", "adds", "one", "more", "line", "of", "text", "to",
    "make", "your", "reply", "longer", "so", "that", "every", "token", "counts", "once",
    "here", "is", "an", "example", "list", "first", "second", "third", "finally",
    "because", "this", "step", "works", "well", "in", "practice", "we", "check",
    "result", "again", "before", "writing", "output", "file", "each", "row", "gets",
    "its", "own", "completion", "which", "ends", "now", ".",
)
# A fixed id per word, spread over the vocabulary, so `text` and `output_ids` agree.
WORD_IDS = tuple((1013 + 3889 * index) % VOCAB_SIZE for index in range(len(WORDS)))


@dataclass(frozen=True)
class Completion:
    """What the model says for one prompt under one token limit."""

    text: str
    output_ids: list[int]
    finish_reason: dict[str, Any]
    # Each token's text, special tokens included, where the answer is not plain words joined
    # by spaces (thinking, JSON; fleetgen/simulator/answers.py); `text` leaves out the special
    # ones when `skip_special_tokens` (SGLang's and vLLM's default).
    pieces: tuple[str, ...] | None = None
    skip_special_tokens: bool = True

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    def token_texts(self) -> list[str]:
        """The text of each output token (for logprobs that carry it)."""
        if self.pieces is not None:
            return list(self.pieces)
        return [word if index == 0 else f" {word}"
                for index, word in enumerate(self.text.split(" ") if self.text else [])]

    def prefix(self, tokens: int, finish_reason: dict[str, Any]) -> Completion:
        """The first `tokens` tokens, as a request cut short (aborted) would have them."""
        if self.pieces is not None:
            return joined(self.pieces[:tokens], self.output_ids[:tokens], finish_reason,
                          self.skip_special_tokens)
        words = self.text.split(" ")[:tokens] if tokens else []
        return Completion(" ".join(words), self.output_ids[:tokens], finish_reason)


# Special tokens the simulated model writes (Qwen3's `<think>` and `</think>`): in `text` only
# when the request keeps special tokens.
SPECIAL_IDS = frozenset({248068, 248069})


def joined(pieces: Sequence[str], ids: Sequence[int], finish_reason: dict[str, Any],
           skip_special_tokens: bool) -> Completion:
    """A completion from its tokens' texts and ids."""
    text = "".join(piece for piece, token in zip(pieces, ids, strict=True)
                   if not (skip_special_tokens and token in SPECIAL_IDS))
    return Completion(text, list(ids), finish_reason, tuple(pieces), skip_special_tokens)


def count_text_tokens(text: str) -> int:
    """Token count of a text prompt under the simulator's crude tokenizer."""
    return len(TOKEN_RE.findall(text))


def request_key(
    seed: int,
    prompt: Sequence[int] | str,
    sample_index: int = 0,
    sampling_seed: int | None = None,
) -> int:
    """A stable 64-bit key for a prompt, so a retry of the same prompt gets the same answer.

    The request's `sampling_seed` is part of it whatever the server flags say, so tests
    can make two samples of one prompt differ; /server_info tells whether a real
    server would honour it (`enable_deterministic_inference`).
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{seed}:{sample_index}:".encode())
    if sampling_seed is not None:
        digest.update(f"s{sampling_seed}:".encode())
    if isinstance(prompt, str):
        digest.update(b"t" + prompt.encode("utf-8", "surrogatepass"))
    else:
        digest.update(b"i" + array("q", prompt).tobytes())
    return int.from_bytes(digest.digest(), "big")


def natural_length(rng: random.Random, mean_tokens: int) -> int:
    """Length the answer would have without limits; the mean is `mean_tokens`."""
    mu = math.log(mean_tokens) - LENGTH_SIGMA**2 / 2
    return max(1, round(rng.lognormvariate(mu, LENGTH_SIGMA)))


def generate(
    key: int,
    mean_tokens: int,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    ignore_eos: bool = False,
) -> Completion:
    """The deterministic answer for `key`, cut at `max_new_tokens`.

    The words are drawn after the length from the same stream, so a smaller limit
    gives a prefix of the longer answer, as greedy decoding would.
    """
    rng = random.Random(key)
    wanted = natural_length(rng, mean_tokens)
    if ignore_eos:
        wanted = max_new_tokens + 1
    wanted = max(wanted, min_new_tokens)
    produced = min(wanted, max_new_tokens)
    indices = rng.choices(range(len(WORDS)), k=produced)
    finish: dict[str, Any]
    if wanted <= max_new_tokens:
        finish = {"type": "stop", "matched": STOP_TOKEN_ID}
    else:
        finish = {"type": "length", "length": max_new_tokens}
    return Completion(
        text=" ".join(WORDS[i] for i in indices),
        output_ids=[WORD_IDS[i] for i in indices],
        finish_reason=finish,
    )


def per_token_s(config: SimConfig, running: int) -> float:
    """Decode time per token with `running` requests in the batch (this one included)."""
    load = running / config.total_slots
    return config.tpot_ms * (1 + config.slowdown * load) / config.speed / 1000


def ttft_s(config: SimConfig) -> float:
    return config.ttft_ms / config.speed / 1000


def tokens_done(elapsed_s: float, first_s: float, each_s: float, total: int) -> int:
    """How many tokens a request had produced `elapsed_s` into its service (for aborts)."""
    if elapsed_s < first_s:
        return 0
    if each_s <= 0:
        return total
    return min(total, 1 + int((elapsed_s - first_s) / each_s))
