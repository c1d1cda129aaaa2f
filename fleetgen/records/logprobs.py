"""Log-probabilities in the compact form a result record carries (pure).

Parallel arrays, one entry per output token, whatever the engine's own shape:

    {"ids": [token id, ...],            the generated tokens
     "lp": [logprob, ...],              the logprob of each generated token
     "top_ids": [[id, ...], ...],       the K most likely tokens at each position (K > 0 only)
     "top_lp": [[logprob, ...], ...]}   their logprobs, in the engine's order

Logprobs are rounded to `DECIMALS` places (an absolute error of 5e-4 in a logprob is a relative
error of 0.05 % in the probability); a value the engine sent as null or not finite is null.
No token text is stored: ids are exact, a token's text is not (byte-level tokens are not
always valid UTF-8), and the text is the tokenizer's to give. docs/formats.md "Thinking,
JSON, logprobs" has the size per token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

DECIMALS = 3


def rounded(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return round(float(value), DECIMALS) + 0.0  # + 0.0: no "-0.0" in the output


def compact(ids: Sequence[int], logprobs: Sequence[Any],
            top: Sequence[Sequence[tuple[int, Any]] | None] | None = None) -> dict[str, Any]:
    """The record form of one answer's logprobs; `top` holds (id, logprob) pairs per position
    (None at a position the engine sent none for)."""
    record: dict[str, Any] = {"ids": [int(i) for i in ids],
                              "lp": [rounded(v) for v in logprobs]}
    if top is not None:
        record["top_ids"] = [[int(i) for i, _ in row] if row else [] for row in top]
        record["top_lp"] = [[rounded(v) for _, v in row] if row else [] for row in top]
    return record
