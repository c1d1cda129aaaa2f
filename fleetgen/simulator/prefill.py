"""One GPU's prefill timeline: uncached prompt tokens cost compute, in chunks, taken from decoding.

SGLang 0.5.23's scheduler runs a prefill batch before any decode step
(`Scheduler.get_next_batch_to_run`: "Run prefill first if possible"; with the default
`prefill_decode_interval` 0, `_should_defer_prefill` never defers it, and
`enable_mixed_chunk` is off): a forward pass is either a prefill chunk of up to
`chunked_prefill_size` new tokens (`PrefillAdder`'s `rem_chunk_tokens`; a longer prompt is
the scheduler's `chunked_req` and continues in the next pass) or one decode step of the
running batch. So prefills run one after the other, and while a chunk runs every request
in the batch waits for its next token.

The lane keeps the chunks it has scheduled as busy intervals on the monotonic clock. A
request's decode work is measured on the *decode clock*, wall time minus the time the lane
was busy: a chunk scheduled while a request decodes pushes its finish back by the chunk's
time. First order only: a chunk costs its tokens over the prefill rate (no attention term
growing with the context, no fixed cost per forward), and a prefill starts at once, not at
the end of the decode step in progress.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


def chunk_sizes(tokens: int, chunk_tokens: int) -> list[int]:
    """The forward passes a prefill of `tokens` takes; `chunk_tokens` < 1: one pass (-1 in
    SGLang disables chunking)."""
    if tokens <= 0:
        return []
    if chunk_tokens < 1:
        return [tokens]
    full, rest = divmod(tokens, chunk_tokens)
    return [chunk_tokens] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class Prefill:
    """What one request's prefill was charged: its tokens, passes and when it ends."""

    tokens: int
    chunks: int
    end_s: float  # monotonic time the last chunk ends
    decode_clock_s: float  # the decode clock at that moment: where its decode starts


class PrefillLane:
    """Serialized prefill chunks on one GPU and the decode clock they hold back."""

    def __init__(self, tokens_per_s: float, chunk_tokens: int) -> None:
        self.tokens_per_s = tokens_per_s
        self.chunk_tokens = chunk_tokens
        self.tokens_total = 0
        self.chunks_total = 0
        self.busy_s_total = 0.0
        # Busy intervals (start, end), in order and disjoint (the lane is serial); the
        # busy time of intervals already dropped is kept in `_busy_before_s`.
        self._intervals: deque[tuple[float, float]] = deque()
        self._busy_before_s = 0.0
        self._free_at = -math.inf

    @property
    def free(self) -> bool:
        """True when prefill costs nothing (an infinite rate): no lane, no stall."""
        return math.isinf(self.tokens_per_s)

    def schedule(self, tokens: int, now: float) -> Prefill:
        """Queue a prefill of `tokens` uncached tokens arriving at `now`."""
        self._forget_before(now)
        chunks = chunk_sizes(tokens, self.chunk_tokens)
        if self.free or not chunks:
            return Prefill(tokens, len(chunks), now, self.decode_clock(now))
        start = max(now, self._free_at)
        end = start + tokens / self.tokens_per_s
        # Back-to-back chunks are one busy interval: nothing decodes between them.
        if self._intervals and self._intervals[-1][1] >= start:
            first, _ = self._intervals.pop()
            self._intervals.append((first, end))
        else:
            self._intervals.append((start, end))
        self._free_at = end
        self.tokens_total += tokens
        self.chunks_total += len(chunks)
        self.busy_s_total += end - start
        return Prefill(tokens, len(chunks), end, self.decode_clock(end))

    def busy_s(self, t: float) -> float:
        """Seconds the lane has been busy up to `t` (of the intervals still kept)."""
        busy = self._busy_before_s
        for start, end in self._intervals:
            if start >= t:
                break
            busy += min(t, end) - start
        return busy

    def decode_clock(self, t: float) -> float:
        """Wall time minus prefill time: how far decoding got by `t`."""
        return t - self.busy_s(t)

    def time_at(self, decode_clock_s: float) -> float:
        """The first moment the decode clock reaches `decode_clock_s`, given the chunks
        scheduled so far (a chunk scheduled later moves it back)."""
        busy = self._busy_before_s
        for start, end in self._intervals:
            if decode_clock_s + busy <= start:
                break
            busy += end - start
        return decode_clock_s + busy

    def _forget_before(self, now: float) -> None:
        # Requests read the clock from `now` on, so intervals that ended are only a sum.
        # A request's own start (`Prefill.decode_clock_s`) was read when it was scheduled.
        while self._intervals and self._intervals[0][1] <= now:
            start, end = self._intervals.popleft()
            self._busy_before_s += end - start
