"""A per-server prefix cache: how many leading prompt tokens an earlier request left reusable.

A request's prompt is matched on admission and inserted after its prefill, as SGLang 0.5.23
does (`checkpoint_kv_cache(req, tree_cache)` in `BatchResultProcessor.
process_batch_result_prefill`, once the extend ran), and a finished request leaves its prompt
*and its output* (`release_kv_cache(req, tree_cache, checkpoint=True)`), so a conversation's
next turn (the history, the answer, a new user turn) can match the answer it extends.

*Where* a matched prefix can be reused depends on the model (`Reuse`, one class per rule):

- `TokenRadix` — a full-attention model on SGLang's radix tree: any prefix, token by token.
- `MambaRadix` — a hybrid model (Qwen3.6: `Qwen3_5ForConditionalGeneration`, Gated DeltaNet
  layers among the attention ones) on SGLang's Mamba radix cache: a prefix is reusable only
  up to a node that holds a linear-attention state, and the server keeps one only at a few
  points of each request (the class's docstring).
- `Blocks` — vLLM's prefix caching: whole blocks (`block_size` tokens); with `align` (a hybrid
  model, `mamba_cache_mode="align"`) only the block boundaries where a state was kept.

The simulator keeps one hash per prefix: the number of distinct hashes is the number of tokens
a radix tree would hold, and the prefixes that end on a kept state are marked (a checkpoint).
It evicts whole sequences, least recently used first, once they hold more tokens than the KV
pool; a sequence another one extends is dropped as the tree would keep it as inner nodes (its
checkpoints pass to the longer one). The Mamba pool's own, smaller capacity is not modelled.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetgen.simulator.config import SimConfig
    from fleetgen.simulator.model import Completion


def prefix_hashes(prompt: Sequence[object] | str, before: Sequence[int] = ()) -> list[int]:
    """One hash per prefix length 1..len, chained, so a prefix match is a hash match.

    `before`: the hashes of the tokens in front of `prompt` (to extend a prompt with its
    output). A text prompt counts one token per whitespace-separated word.
    """
    tokens: Sequence[object] = prompt.split() if isinstance(prompt, str) else prompt
    hashes = list(before)
    last = hashes[-1] if hashes else 0
    for token in tokens:
        # Python's tuple hash (64 bits): stable within the process that holds the cache.
        last = hash((last, token))
        hashes.append(last)
    return hashes


def finished_hashes(prompt_hashes: list[int], prompt: Sequence[int] | str,
                    completion: Completion) -> list[int]:
    """What a finished request leaves in the tree: the prompt and its output but the last
    token, whose KV was never computed (it was sampled, not fed back).

    `release_kv_cache(req, tree_cache, checkpoint=True)` (mem_cache/common.py, 0.5.23's form
    of `cache_finished_req`) calls `checkpoint(req, up_to=owned_kv_len)`, which inserts
    `req.full_untruncated_fill_ids[:up_to]`: `origin_input_ids + output_ids`
    (`Req.refresh_fill_ids`) up to `Req.owned_kv_len` = `min(kv_committed_len, input +
    output_ids_through_stop)`, and a decode step commits the KV of its input token only.
    A text prompt's output counts as its words, as the prompt does.
    """
    kept = completion.completion_tokens - 1
    if kept <= 0:
        return prompt_hashes
    output: Sequence[object]
    output = completion.text.split()[:kept] if isinstance(prompt, str) else \
        completion.output_ids[:kept]
    return prefix_hashes(output, before=prompt_hashes)


@dataclass(frozen=True)
class Hit:
    """A prompt's match: the tokens reused, and how far its tokens are in the tree at all."""

    cached: int
    # The longest prefix in the tree (SGLang's `full_kv_hit_length`), at most the prompt's
    # length - 1; beyond `cached` when the tree holds the tokens but no state there.
    common: int = 0


@dataclass(frozen=True)
class Insert:
    """What to put in the tree: the first `length` tokens, with a state at `checkpoints`
    (None: at every token)."""

    length: int
    checkpoints: tuple[int, ...] | None = None


class Reuse:
    """Where a prefix can be reused: the match's rule and what a request leaves behind."""

    def cached(self, common: int, deepest_checkpoint: int) -> int:
        return common

    def after_prefill(self, prompt_len: int, hit: Hit) -> list[Insert]:
        return [Insert(prompt_len)]

    def after_decode(self, prompt_len: int, kept_len: int) -> list[Insert]:
        return [Insert(kept_len)]


class TokenRadix(Reuse):
    """SGLang's `RadixCache` on a full-attention model: every matched token is reused."""


@dataclass(frozen=True)
class Blocks(Reuse):
    """vLLM 0.32's prefix caching: a hit is whole blocks (`KVCacheManager.
    get_computed_blocks`, hashed full blocks), at most the prompt's length - 1 (the last
    token is always computed). On CPU the block is 128 tokens (`CpuPlatform.
    check_and_update_config`: `cache_config.block_size = 128` unless given): a repeated
    259-token prompt has 256 cached, a 91-token one 0, as the real server reported.

    `align`: a hybrid model's `mamba_cache_mode="align"` ("only cache the mamba state of the
    last token of each scheduler step and when the token is at position i * block_size",
    config/cache.py), with the block made as large as a state (`Platform.
    _align_hybrid_block_size`: 640 tokens for the tiny Qwen3.5 served on CPU). The prefill
    keeps one state, at `get_mamba_prefill_checkpoint_position` = (prompt_len - 1) //
    block_size * block_size (`Scheduler._mamba_block_aligned_split` ends the chunk there);
    decode keeps one at every block boundary it passes."""

    block_size: int = 128
    align: bool = False

    def cached(self, common: int, deepest_checkpoint: int) -> int:
        if self.align:
            return deepest_checkpoint
        return common // self.block_size * self.block_size

    def after_prefill(self, prompt_len: int, hit: Hit) -> list[Insert]:
        if not self.align:
            return [Insert(prompt_len)]
        at = (prompt_len - 1) // self.block_size * self.block_size
        return [Insert(prompt_len, (at,) if at > 0 else ())]

    def after_decode(self, prompt_len: int, kept_len: int) -> list[Insert]:
        if not self.align:
            return [Insert(kept_len)]
        first = prompt_len // self.block_size + 1
        kept = tuple(k * self.block_size for k in range(first, kept_len // self.block_size + 1))
        return [Insert(kept_len, kept)]


# SGLang 0.5.23 `arg_groups/overrides.py` `mamba_cache_chunk_size`: the FLA kernels' chunk
# (`fla.chunk_delta_h.CHUNK_SIZE`, 64; Qwen3.5's config sets no `mamba_chunk_size`), or the
# page size when larger.
FLA_CHUNK_SIZE = 64
# `arg_groups/fields/exec_.py`: `mamba_track_interval` = 256 ("The interval to track the
# mamba state during decode").
MAMBA_TRACK_INTERVAL = 256


@dataclass(frozen=True)
class MambaRadix(Reuse):
    """SGLang 0.5.23's Mamba radix cache with `extra_buffer`, what a Qwen3.6 server runs:
    `_mamba_radix_cache_resolution` (arg_groups/overrides.py) resolves `auto` to
    `extra_buffer` for `Qwen3_5ForConditionalGeneration` (in `_MAMBA_EXTRA_BUFFER_ARCHS`) as
    the overlap schedule is on by default.

    - **Match** (`unified_cache/components/mamba.py` `create_match_validator`): the match
      ends at the deepest node that holds a state; the tokens beyond it are computed again.
    - **Prefill** (`ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`, no DCP):
      each extend (a chunk of at most `chunked_prefill_size` tokens) keeps one state, at
      `prefix_len + extend_len // grid * grid` when `extend_len >= grid`, with `grid` =
      `mamba_checkpoint_grid(page_size)` = lcm(max(64, page_size), page_size): 64 at page 1.
      Where the tree holds more of the prompt than its last state (`full_kv_hit_length`
      beyond the match), the state is kept at that branching point instead
      (`finalize_match_result_in_tree_core`'s `mamba_branching_seqlen`, the last grid
      multiple inside the full-KV hit), so the next request sharing it starts there.
      `checkpoint_kv_cache` then inserts the prompt up to that state (`prepare_for_caching_req`
      returns `mamba_last_track_seqlen`, and `checkpoint_into_tree` cuts the key there).
    - **Decode** (`ScheduleBatch.prepare_for_decode`, `mamba_track_mask = seq_lens %
      mamba_track_grid == 0`, with `mamba_track_grid` = lcm(grid, `mamba_track_interval`) =
      256): a state every 256 tokens of the sequence; the finished request donates the latest
      one (`MambaComponent._select_finished_checkpoint`) and the sequence is inserted up to
      it, or not at all when decoding passed none (the prefill's was already donated).
    """

    page_size: int = 1
    chunked_prefill_size: int = 8192
    track_interval: int = MAMBA_TRACK_INTERVAL

    @property
    def grid(self) -> int:
        return math.lcm(max(FLA_CHUNK_SIZE, self.page_size), self.page_size)

    @property
    def track_grid(self) -> int:
        return math.lcm(self.grid, self.track_interval)

    def cached(self, common: int, deepest_checkpoint: int) -> int:
        return deepest_checkpoint

    def after_prefill(self, prompt_len: int, hit: Hit) -> list[Insert]:
        grid, chunk = self.grid, self.chunked_prefill_size
        aligned = hit.common // grid * grid
        branching = aligned if aligned > hit.cached else None
        inserts, start = [], hit.cached
        while start < prompt_len:
            end = prompt_len if chunk < 1 else min(prompt_len, start + chunk)
            extend = end - start
            if extend >= grid:
                kept = start + extend // grid * grid
                # `mamba_track_seqlen` is `seq_end` here (the grid is the FLA chunk's).
                if branching is not None and start < branching < end \
                        and (branching - start) % max(FLA_CHUNK_SIZE, self.page_size) == 0:
                    kept = branching
                inserts.append(Insert(kept, (kept,)))
            start = end
        return inserts

    def after_decode(self, prompt_len: int, kept_len: int) -> list[Insert]:
        latest = kept_len // self.track_grid * self.track_grid
        return [Insert(latest, (latest,))] if latest > prompt_len else []


# Sequences sharing a prefix store it once each: their hashes together may outnumber the
# distinct tokens by this much before the oldest go, which bounds the simulator's memory.
STORED_PER_TOKEN = 4


@dataclass
class _Sequence:
    hashes: list[int]
    checkpoints: set[int]  # hashes of the prefixes that end on a kept state


class PrefixCache:
    def __init__(self, capacity_tokens: int, reuse: Reuse | None = None) -> None:
        self.capacity_tokens = capacity_tokens
        self.reuse = reuse if reuse is not None else TokenRadix()
        self._counts: Counter[int] = Counter()
        self._checkpoints: Counter[int] = Counter()
        # Each sequence by the hash of its last token, least recently used first.
        self._sequences: OrderedDict[int, _Sequence] = OrderedDict()
        self._stored = 0

    @property
    def tokens(self) -> int:
        """Tokens held: one per distinct prefix, as the radix tree's nodes hold them."""
        return len(self._counts)

    def lookup(self, hashes: list[int]) -> Hit:
        """The prompt's hit; the last token is always computed (`Req.
        _compute_max_prefix_len`: `input_len - 1`)."""
        common = deepest = 0
        for depth, hashed in enumerate(hashes[:max(0, len(hashes) - 1)], start=1):
            if hashed not in self._counts:
                break
            common = depth
            if hashed in self._checkpoints:
                deepest = depth
        return Hit(self.reuse.cached(common, deepest), common)

    def match(self, hashes: list[int]) -> int:
        """Cached tokens for a prompt."""
        return self.lookup(hashes).cached

    def after_prefill(self, hashes: list[int], hit: Hit) -> None:
        for insert in self.reuse.after_prefill(len(hashes), hit):
            self._insert_part(hashes, insert)

    def after_decode(self, hashes: list[int], prompt_len: int) -> None:
        """`hashes`: the prompt's and the kept output's (`finished_hashes`)."""
        for insert in self.reuse.after_decode(prompt_len, len(hashes)):
            self._insert_part(hashes, insert)

    def _insert_part(self, hashes: list[int], insert: Insert) -> None:
        marks = () if insert.checkpoints is None else \
            [hashes[depth - 1] for depth in insert.checkpoints if 0 < depth <= insert.length]
        self.insert(hashes[:insert.length], marks)

    def insert(self, hashes: list[int], checkpoints: Sequence[int] = ()) -> None:
        """Put a sequence in the tree, with states at the prefixes hashed `checkpoints`."""
        if not hashes:
            return
        key = hashes[-1]
        sequence = self._sequences.get(key)
        if sequence is not None:
            self._sequences.move_to_end(key)
            self._mark(sequence, checkpoints)
            return
        sequence = _Sequence(hashes, set())
        for hashed in hashes[:-1]:
            if hashed in self._sequences:  # a sequence this one extends: now inner nodes
                self._mark(sequence, self._sequences[hashed].checkpoints)
                self._drop(hashed)
        self._sequences[key] = sequence
        self._counts.update(hashes)
        self._mark(sequence, checkpoints)
        self._stored += len(hashes)
        while len(self._sequences) > 1 and (
            self.tokens > self.capacity_tokens
            or self._stored > STORED_PER_TOKEN * self.capacity_tokens
        ):
            self._drop(next(iter(self._sequences)))

    def _mark(self, sequence: _Sequence, checkpoints: Sequence[int] | set[int]) -> None:
        fresh = set(checkpoints) - sequence.checkpoints
        sequence.checkpoints |= fresh
        self._checkpoints.update(fresh)

    def _drop(self, key: int) -> None:
        dropped = self._sequences.pop(key)
        self._stored -= len(dropped.hashes)
        for hashed in dropped.hashes:
            self._counts[hashed] -= 1
            if self._counts[hashed] <= 0:
                del self._counts[hashed]
        for hashed in dropped.checkpoints:
            self._checkpoints[hashed] -= 1
            if self._checkpoints[hashed] <= 0:
                del self._checkpoints[hashed]


# vLLM 0.32 on CPU: `CpuPlatform.check_and_update_config` sets `block_size = 128` unless the
# server was given one; a hybrid model's block is then widened to hold a state
# (`_align_hybrid_block_size`), which the real server logged as 640 for the tiny Qwen3.5 of
# ../shared/notes/vllm-cpu.md (a repeated 259-token prompt: 0 cached).
VLLM_CPU_BLOCK_SIZE = 128
VLLM_HYBRID_BLOCK_SIZE = 640


def reuse_for(config: SimConfig) -> Reuse:
    """The rule of the server the config describes: the flavour's cache for the model's kind
    (`--prefix-cache hybrid`, Qwen3.6's, or `full`)."""
    hybrid = config.prefix_cache == "hybrid"
    if config.flavor == "vllm":
        default = VLLM_HYBRID_BLOCK_SIZE if hybrid else VLLM_CPU_BLOCK_SIZE
        return Blocks(config.cache_block_size or default, align=hybrid)
    if hybrid:
        return MambaRadix(config.page_size, config.chunked_prefill_size,
                          config.mamba_track_interval)
    return TokenRadix()
