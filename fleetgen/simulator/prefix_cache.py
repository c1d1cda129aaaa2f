"""A per-server prefix cache: how many leading prompt tokens an earlier request left in KV.

SGLang's radix cache reports `cached_tokens` > 0 when a prompt shares a prefix
with one it served before (a retried prompt is mostly cached). The simulator
keeps a hash per prefix length of recent prompts, evicting whole prompts, oldest
first, once they would hold more tokens than the KV pool.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Sequence


def prefix_hashes(prompt: Sequence[int] | str) -> list[bytes]:
    """One digest per prefix length 1..len: a prefix match is a digest match."""
    tokens: Sequence[object] = prompt.split() if isinstance(prompt, str) else prompt
    digest = hashlib.blake2b(digest_size=8)
    hashes = []
    for token in tokens:
        digest.update(f"{token},".encode())
        hashes.append(digest.copy().digest())
    return hashes


class PrefixCache:
    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._counts: Counter[bytes] = Counter()
        self._prompts: OrderedDict[bytes, list[bytes]] = OrderedDict()
        self._tokens = 0

    def match(self, hashes: list[bytes]) -> int:
        """Cached tokens for a prompt; the last token is always computed.

        `Req.init_next_round_input` caps the match at `input_len - 1`.
        """
        matched = 0
        for hashed in hashes:
            if hashed not in self._counts:
                break
            matched += 1
        return min(matched, max(0, len(hashes) - 1))

    def insert(self, hashes: list[bytes]) -> None:
        if not hashes:
            return
        key = hashes[-1]
        if key in self._prompts:
            self._prompts.move_to_end(key)
            return
        self._prompts[key] = hashes
        self._counts.update(hashes)
        self._tokens += len(hashes)
        while self._tokens > self.capacity_tokens and len(self._prompts) > 1:
            _, old = self._prompts.popitem(last=False)
            for hashed in old:
                self._counts[hashed] -= 1
                if self._counts[hashed] <= 0:
                    del self._counts[hashed]
            self._tokens -= len(old)
