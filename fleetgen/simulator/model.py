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

from fleetgen.simulator import vocab
from fleetgen.simulator.config import SimConfig

# Qwen3.6's vocabulary (fleetgen/simulator/vocab.py): ordinary ids below VOCAB_SIZE, and a
# natural stop ends the output with the end-of-turn id, as a real Qwen3.6 server's does.
VOCAB_SIZE = vocab.ORDINARY_SIZE
STOP_TOKEN_ID = vocab.EOS_ID
MAX_INPUT_ID = 2**31 - 1

# Crude tokenizer for `text` prompts: one token per word and per punctuation mark.
# It only has to be stable and roughly proportional to a real tokenizer.
TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# Heavy tail like real completion lengths: lognormal, sigma 1 (mean/median ≈ 1.65).
LENGTH_SIGMA = 1.0

# Every word is one Qwen3.6 token at the start of a text and another after a space, so `text`
# and `output_ids` agree (the ids are the tokenizer's own encoding of the text).
WORDS = vocab.WORDS
WORD_IDS = vocab.SPACED_IDS


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
        """The text of each output token, special ones included (for logprobs that carry it:
        SGLang decodes each id alone, `detokenize_logprob_tokens`)."""
        if self.pieces is not None:
            return list(self.pieces)
        texts = [word if index == 0 else f" {word}"
                 for index, word in enumerate(self.text.split(" ") if self.text else [])]
        return texts + [vocab.EOS_TEXT] * (len(self.output_ids) - len(texts))

    def prefix(self, tokens: int, finish_reason: dict[str, Any]) -> Completion:
        """The first `tokens` tokens, as a request cut short (aborted) would have them."""
        if self.pieces is not None:
            return joined(self.pieces[:tokens], self.output_ids[:tokens], finish_reason,
                          self.skip_special_tokens)
        words = self.text.split(" ")[:tokens] if tokens else []
        return Completion(" ".join(words), self.output_ids[:tokens], finish_reason)


# Special tokens (Qwen3.6's `special: true`, fleetgen/simulator/vocab.py): in `text` only when
# the request keeps special tokens. `<think>` and `</think>` are not among them.
SPECIAL_IDS = vocab.SPECIAL_IDS


def joined(pieces: Sequence[str], ids: Sequence[int], finish_reason: dict[str, Any],
           skip_special_tokens: bool) -> Completion:
    """A completion from its tokens' texts and ids. The stop token that ended it is in the ids
    and never in the text: SGLang decodes the ids without it (`DetokenizerManager.
    trim_matched_stop`: "Trim stop token", `output[:-1]` when `matched` is an int), vLLM's
    detokenizer skips it (`stop_terminated`), llama.cpp gives a control token no text."""
    shown = len(ids) - 1 if ids and finish_reason.get("matched") == ids[-1] else len(ids)
    text = "".join(piece for piece, token in zip(pieces[:shown], ids[:shown], strict=True)
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
    gives a prefix of the longer answer, as greedy decoding would. A natural stop is one
    more token, the end-of-turn id, counted in `completion_tokens` and left out of the text:
    SGLang keeps the stop token in the output (`Req.output_ids_through_stop`, "Stop position
    is included"; `_check_token_based_finish` sets `finished_len = matched_pos + 1`), and it
    is checked before the length cap (`update_finish_state`), so it still fits when it is
    the `max_new_tokens`-th token. `min_new_tokens` holds it back until that many tokens
    came (the EOS is masked before), `ignore_eos` for good.
    """
    rng = random.Random(key)
    words = natural_length(rng, mean_tokens)
    if ignore_eos:
        words = max_new_tokens + 1
    words = max(words, min_new_tokens)
    produced = min(words, max_new_tokens)
    indices = rng.choices(range(len(WORDS)), k=produced)
    ids = [vocab.SPACED_IDS[i] for i in indices]
    if ids:
        ids[0] = vocab.FIRST_IDS[indices[0]]
    finish: dict[str, Any]
    if words < max_new_tokens:
        ids.append(STOP_TOKEN_ID)
        finish = {"type": "stop", "matched": STOP_TOKEN_ID}
    else:
        finish = {"type": "length", "length": max_new_tokens}
    return Completion(text=" ".join(WORDS[i] for i in indices), output_ids=ids,
                      finish_reason=finish)


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
