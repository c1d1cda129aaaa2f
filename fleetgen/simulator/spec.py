"""Speculative decoding as the simulator models it: how many draft tokens each verify step of
an answer accepts (per server and per prompt, deterministically), and the figures SGLang puts
in a finished request's meta_info and vLLM counts on /metrics.

The model: the answer's first token comes from the prefill, every later step is one verify
forward pass that proposes `speculative_num_draft_tokens - 1` drafts and keeps the leading run
of correct ones plus the bonus token (EAGLE's chain, DFlash's block, an n-gram guess alike).
Each draft is right with a probability chosen so that the expected share of correct drafts is
the prompt's rate: the server's `--spec-accept-rate` moved by up to +/- spread/2 by a hash of
the prompt, so the same prompt is as hard on every server and two drafters differ by their
rate alone.
"""

from __future__ import annotations

import functools
import hashlib
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetgen.simulator.config import SimConfig

# Mixed into the answer's key so the acceptance draws are a stream of their own, apart from
# the words (model.generate) and the logprobs.
DRAW_SALT = 0x5bec


@dataclass(frozen=True)
class SpecSteps:
    """One answer's verify steps, as SGLang's scheduler counts them (`Req.spec_verify_ct`,
    `spec_num_correct_drafts`, `update_spec_correct_drafts_histogram`)."""

    verify_ct: int
    correct_drafts: int
    drafts_per_step: int
    histogram: tuple[int, ...]  # steps by correct drafts (0, 1, ...), as SGLang's list

    @property
    def proposed_drafts(self) -> int:
        return self.verify_ct * self.drafts_per_step

    def accepted_at(self, position: int) -> int:
        """Steps whose draft at `position` (0-based) was accepted: vLLM's per-position count."""
        return sum(self.histogram[position + 1:])


def drafts_per_step(config: SimConfig) -> int:
    """Drafts one verify step proposes: `_calculate_spec_decoding_metrics` counts
    `spec_verify_ct * (speculative_num_draft_tokens - 1)` proposed."""
    return max(0, config.speculative_num_draft_tokens - 1)


def prompt_rate(config: SimConfig, prompt: Sequence[int] | str) -> float:
    """The share of correct drafts this server's drafter has on this prompt."""
    digest = hashlib.blake2b(digest_size=8, person=b"fg-spec")
    if isinstance(prompt, str):
        digest.update(b"t" + prompt.encode("utf-8", "surrogatepass"))
    else:
        digest.update(b"i" + array("q", prompt).tobytes())
    u = int.from_bytes(digest.digest(), "big") / 2**64
    rate = config.spec_accept_rate * (1 + config.spec_accept_spread * (u - 0.5))
    return min(1.0, max(0.0, rate))


@functools.lru_cache(maxsize=4096)
def per_draft_probability(rate: float, drafts: int) -> float:
    """p such that a chain of `drafts` drafts, each right with p and kept up to the first
    wrong one, keeps `rate * drafts` of them on average: (p + p^2 + ... + p^k) / k = rate."""
    if drafts <= 0 or rate <= 0:
        return 0.0
    if rate >= 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(50):  # bisection: the mean is increasing in p
        p = (low + high) / 2
        mean = sum(p**i for i in range(1, drafts + 1)) / drafts
        low, high = (p, high) if mean < rate else (low, p)
    return (low + high) / 2


def steps_for(config: SimConfig, key: int, prompt: Sequence[int] | str,
              completion_tokens: int) -> SpecSteps:
    """The verify steps that produced `completion_tokens` tokens (none for a one-token answer:
    its token came from the prefill). A shorter answer of the same request (an abort) is a
    prefix of the same steps. The last step's correct drafts count whole even where the stop
    or the limit cuts them, as the scheduler counts them before it checks the finish."""
    drafts = drafts_per_step(config)
    p = per_draft_probability(prompt_rate(config, prompt), drafts)
    rng = random.Random(key ^ DRAW_SALT)
    histogram = [0] * (drafts + 1)
    produced, steps, correct = min(completion_tokens, 1), 0, 0
    while produced < completion_tokens:
        accepted = 0
        while accepted < drafts and rng.random() < p:
            accepted += 1
        steps += 1
        correct += accepted
        histogram[accepted] += 1
        produced += 1 + accepted
    while len(histogram) > 1 and histogram[-1] == 0:
        histogram.pop()  # SGLang's list grows only as far as the largest count seen
    return SpecSteps(steps, correct, drafts, tuple(histogram))


def decode_steps(config: SimConfig, key: int, prompt: Sequence[int] | str,
                 completion_tokens: int) -> int:
    """Forward passes after the first token: one a token without speculation, one a verify
    step with it (so the decode speed follows the accepted length)."""
    if config.speculative_algorithm is None:
        return completion_tokens
    return steps_for(config, key, prompt, completion_tokens).verify_ct


def meta_info_fields(steps: SpecSteps, completion_tokens: int) -> dict[str, Any]:
    """`TokenizerManager._calculate_spec_decoding_metrics` (0.5.23), called for a finished
    request when a speculative algorithm runs: nothing unless `spec_verify_ct > 0` and drafts
    were proposed; the histogram only when it is not empty."""
    if steps.verify_ct <= 0 or steps.proposed_drafts <= 0:
        return {}
    fields: dict[str, Any] = {
        "spec_accept_rate": steps.correct_drafts / steps.proposed_drafts,
        "spec_accept_length": completion_tokens / steps.verify_ct,
        "spec_num_correct_drafts": steps.correct_drafts,
        "spec_num_proposed_drafts": steps.proposed_drafts,
        "spec_verify_ct": steps.verify_ct,
    }
    if any(steps.histogram):
        fields["spec_correct_drafts_histogram"] = list(steps.histogram)
    return fields


def vllm_request_metrics(steps: SpecSteps) -> dict[str, Any]:
    """vLLM 0.32's `metrics.speculative_decoding` (v1/metrics/stats.py
    `RequestSpecDecodeMetrics.to_dict`): a dense histogram of `num_spec_tokens` + 1 entries,
    the mean acceptance length with the bonus token (1.0 without a step), the draft-only rate
    (0.0 without drafts)."""
    histogram = list(steps.histogram) + [0] * (steps.drafts_per_step + 1 - len(steps.histogram))
    return {
        "mean_acceptance_length": 1.0 + steps.correct_drafts / steps.verify_ct
        if steps.verify_ct else 1.0,
        "draft_acceptance_rate": steps.correct_drafts / steps.proposed_drafts
        if steps.proposed_drafts else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": steps.verify_ct,
        "num_accepted_draft_tokens": steps.correct_drafts,
        "num_draft_tokens": steps.proposed_drafts,
        "num_spec_tokens": steps.drafts_per_step,
    }
