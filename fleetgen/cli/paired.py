"""Two drafters on the same prompts (pure): the answers of two runs of one input, each on one
drafter, joined by request (id, sample, turn), and the difference of their pooled acceptance
with its 95 % interval. Within one run the shared queue decides which prompts each server
answers, so two servers' figures measure different prompts; paired, every prompt counts for
both and the prompts' own spread cancels out of the difference.

The pooled figure is a ratio, Σ tokens / Σ verify steps (fleetgen/drainer/acceptance.py): its
standard error is the linearised one of a ratio estimator, per prompt (y − R x) / x̄, and the
difference's is that of the per-prompt difference of the two linearised values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from fleetgen.drainer.acceptance import steps_of

Z95: Final = 1.96
Key = tuple[str, Any, Any]


def request_of(record: Mapping[str, Any]) -> Key:
    return str(record.get("id")), record.get("sample"), record.get("turn")


def steps_by_request(records: Iterable[Mapping[str, Any]]) -> dict[Key, tuple[int, int]]:
    """(tokens, verify steps) of every answer that reports its acceptance, by request."""
    out: dict[Key, tuple[int, int]] = {}
    for record in records:
        steps = steps_of(record)
        if steps is not None:
            out[request_of(record)] = (steps[0], steps[1])
    return out


def paired(a: Mapping[Key, tuple[int, int]], b: Mapping[Key, tuple[int, int]]
           ) -> dict[str, Any] | None:
    """B − A on the requests both answered (None with fewer than two such): each pooled
    figure, the difference and its 95 % interval, and how many answers only one side has."""
    both = sorted(set(a) & set(b))
    if len(both) < 2:
        return None
    ra, za = _ratio_terms([a[k] for k in both])
    rb, zb = _ratio_terms([b[k] for k in both])
    if ra is None or rb is None:
        return None
    diffs = [zb_i - za_i for za_i, zb_i in zip(za, zb, strict=True)]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
    half = Z95 * math.sqrt(var / len(diffs))
    delta = rb - ra
    return {"requests": len(both), "a": round(ra, 4), "b": round(rb, 4),
            "difference": round(delta, 4),
            "difference_ci95": [round(delta - half, 4), round(delta + half, 4)],
            "only_a": len(set(a) - set(b)), "only_b": len(set(b) - set(a))}


def _ratio_terms(pairs: list[tuple[int, int]]) -> tuple[float | None, list[float]]:
    """R = Σ tokens / Σ steps and each answer's linearised term (y − R x) / x̄; an answer with
    no verify step (vLLM's 1.0) counts as one token a step, as its forward passes go."""
    ys = [t if s else 1 for t, s in pairs]
    xs = [s if s else 1 for _, s in pairs]
    total_x = sum(xs)
    if not total_x:
        return None, []
    ratio = sum(ys) / total_x
    mean_x = total_x / len(xs)
    return ratio, [(y - ratio * x) / mean_x for y, x in zip(ys, xs, strict=True)]
