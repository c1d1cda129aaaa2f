"""A per-server prefix cache: how many leading prompt tokens an earlier request left in KV.

SGLang's radix cache reports `cached_tokens` > 0 when a prompt shares a prefix
with one it served before (a retried prompt is mostly cached), and a finished request
leaves its prompt *and its output* in the tree, so a conversation's next turn (the history,
the answer, a new user turn) matches the answer it extends. The simulator keeps one hash per
prefix: the number of distinct hashes is the number of tokens a radix tree would hold. It
evicts whole sequences, least recently used first, once they hold more tokens than the KV
pool; a sequence another one extends is dropped as the tree would keep it as inner nodes.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

    `release_kv_cache(req, tree_cache, checkpoint=True)` (mem_cache/common.py, 0.5.23's
    form of `cache_finished_req`) calls `RadixCache.checkpoint(req, up_to=owned_kv_len)`,
    which inserts `req.full_untruncated_fill_ids[:up_to]`: `origin_input_ids + output_ids`
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


# Sequences sharing a prefix store it once each: their hashes together may outnumber the
# distinct tokens by this much before the oldest go, which bounds the simulator's memory.
STORED_PER_TOKEN = 4


class PrefixCache:
    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._counts: Counter[int] = Counter()
        # Each sequence by the hash of its last token, least recently used first.
        self._sequences: OrderedDict[int, list[int]] = OrderedDict()
        self._stored = 0

    @property
    def tokens(self) -> int:
        """Tokens held: one per distinct prefix, as the radix tree's nodes hold them."""
        return len(self._counts)

    def match(self, hashes: list[int]) -> int:
        """Cached tokens for a prompt; the last token is always computed.

        `Req.init_next_round_input` caps the match at `input_len - 1`.
        """
        matched = 0
        for hashed in hashes:
            if hashed not in self._counts:
                break
            matched += 1
        return min(matched, max(0, len(hashes) - 1))

    def insert(self, hashes: list[int]) -> None:
        if not hashes:
            return
        key = hashes[-1]
        if key in self._sequences:
            self._sequences.move_to_end(key)
            return
        for hashed in hashes[:-1]:
            if hashed in self._sequences:  # a sequence this one extends: now inner nodes
                self._drop(hashed)
        self._sequences[key] = hashes
        self._counts.update(hashes)
        self._stored += len(hashes)
        while len(self._sequences) > 1 and (
            self.tokens > self.capacity_tokens
            or self._stored > STORED_PER_TOKEN * self.capacity_tokens
        ):
            self._drop(next(iter(self._sequences)))

    def _drop(self, key: int) -> None:
        dropped = self._sequences.pop(key)
        self._stored -= len(dropped)
        for hashed in dropped:
            self._counts[hashed] -= 1
            if self._counts[hashed] <= 0:
                del self._counts[hashed]
