"""What a stratified sample's answers say about the whole input (pure): the stratified mean and
its 95 % interval, weighted percentiles, the share of answers each cap would cut, the fleet's
speed, the run's wall time, GPU-hours and output size; used by `fleetgen estimate`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Z95 = 1.96  # the normal quantile of a two-sided 95 % interval
# What `--token-ids` adds to a result line where the sample did not keep the ids: the ids as a
# JSON list (docs/formats.md "Token ids": about 7 bytes a token) and the prompt's digest.
BYTES_PER_ID = 7
DIGEST_BYTES = len(',"output_ids":[],"prompt_ids_digest":"0123456789abcdef"')


@dataclass(frozen=True)
class Answer:
    """One sampled request's answer, as its result line says."""

    stratum: int
    completion_tokens: int
    at_budget: bool  # finish_reason "length": it used all the room its prompt left
    line_bytes: int  # its result line without the output ids
    ids_bytes: int  # what the output ids add to the line (measured, or BYTES_PER_ID a token)
    latency_s: float
    started_at: float
    finished_at: float

    def cut_by(self, cap: int) -> bool:
        """Whether `--max-output-tokens cap` would cut this answer. Exact, censoring and all:
        an answer that hit its own budget b was cut there, so it is cut again by a cap >= b
        (its budget is still b) and by a cap < b (it had already passed it)."""
        return self.at_budget or self.completion_tokens > cap

    def tokens_under(self, cap: int | None) -> int:
        return self.completion_tokens if cap is None else min(self.completion_tokens, cap)


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float


def stratified_mean(answers: Sequence[Answer], sizes: Sequence[int],
                    value: Callable[[Answer], float]) -> Interval:
    """Σ W_h ȳ_h over the strata that have answers, with its 95 % interval for the run's
    own mean from Σ W_h² (1 + n_h/N_h) s_h² / n_h. The run generates every answer again, so
    the answers' randomness is in the gap as well as the choice of rows: a small share of a
    stratum gives the usual s²/n (s² holds both); sampled whole, the sample's answers and the
    run's are two draws of each row, 2 s²/N (an upper bound: s² counts the prompts' spread
    too). The finite population correction (1 − n/N) said a stratum sampled whole has no
    error, and an estimate of the whole input printed `328 (95 % 328-328)`. A stratum without
    answers is left out and the weights renormalised."""
    groups: dict[int, list[float]] = {}
    for a in answers:
        groups.setdefault(a.stratum, []).append(value(a))
    covered = sum(sizes[h] for h in groups)
    mean = variance = 0.0
    for h, ys in groups.items():
        w, n = sizes[h] / covered, len(ys)
        m = sum(ys) / n
        s2 = sum((y - m) ** 2 for y in ys) / (n - 1) if n > 1 else 0.0
        mean += w * m
        variance += w * w * (1 + min(1.0, n / sizes[h])) * s2 / n
    half = Z95 * math.sqrt(variance)
    return Interval(mean, mean - half, mean + half)


def weighted_quantiles(answers: Sequence[Answer], sizes: Sequence[int],
                       qs: Sequence[float]) -> list[int]:
    """The completion-token quantiles of the input, each answer weighing the rows of its
    stratum it stands for (N_h / n_h)."""
    counts: dict[int, int] = {}
    for a in answers:
        counts[a.stratum] = counts.get(a.stratum, 0) + 1
    pairs = sorted((a.completion_tokens, sizes[a.stratum] / counts[a.stratum]) for a in answers)
    total = sum(w for _, w in pairs)
    out = []
    for q in qs:
        seen = 0.0
        for tokens, w in pairs:
            seen += w
            if seen >= q * total:
                out.append(tokens)
                break
    return out


@dataclass(frozen=True)
class Fleet:
    engines: int
    gpus_per_engine: int
    slots: int | None  # requests the servers run at once, all of them; None: not reported


def speed(answers: Sequence[Answer], fleet: Fleet) -> dict[str, Any]:
    """The fleet's tokens/s when every slot is busy (Little's law): a busy slot's rate times
    the slots. A busy slot's rate is measured where the sample kept at least 90 % of the slots
    busy (its tokens spread evenly over each request's latency, prefill in it), so it is the
    rate under full load; a sample that never filled the fleet gives its requests' own rate,
    and on a GPU, whose requests decode slower in a fuller batch, the wall time projected is
    then a lower bound (`saturated` false)."""
    tokens = sum(a.completion_tokens for a in answers)
    busy_s = sum(a.latency_s for a in answers)
    span_s = max(a.finished_at for a in answers) - min(a.started_at for a in answers)
    concurrency = busy_s / span_s if span_s > 0 else 1.0
    full = busy_rate(answers, 0.9 * fleet.slots) if fleet.slots else None
    per_slot = full if full is not None else (tokens / busy_s if busy_s > 0 else 0.0)
    slots = fleet.slots or concurrency
    return {"request_tokens_per_s": round(tokens / busy_s, 1) if busy_s > 0 else None,
            "busy_slot_tokens_per_s": None if full is None else round(full, 1),
            "slots": fleet.slots, "sample_concurrency": round(concurrency, 1),
            "sample_tokens_per_s": round(tokens / span_s, 1) if span_s > 0 else None,
            "tokens_per_s": round(per_slot * slots, 1), "saturated": full is not None}


def busy_rate(answers: Sequence[Answer], at_least: float) -> float | None:
    """Tokens/s a request made while at least `at_least` requests ran at once; None if they
    never did. A sweep over the requests' starts and ends."""
    events = sorted([(a.started_at, 1, a) for a in answers if a.latency_s > 0]
                    + [(a.finished_at, -1, a) for a in answers if a.latency_s > 0],
                    key=lambda e: (e[0], e[1]))
    running, rate = 0, 0.0
    slot_s = tokens = 0.0
    last = events[0][0] if events else 0.0
    for at, step, a in events:
        if running >= at_least and at > last:
            slot_s += running * (at - last)
            tokens += rate * (at - last)
        running += step
        rate += step * a.completion_tokens / a.latency_s
        last = at
    return tokens / slot_s if slot_s > 0 else None


def cap_row(answers: Sequence[Answer], sizes: Sequence[int], requests: int, cap: int | None,
            tokens_per_s: float, gpus: int) -> dict[str, Any]:
    """The run under one cap: its answers' mean, the share cut, the tokens, the time."""
    mean = stratified_mean(answers, sizes, lambda a: a.tokens_under(cap))
    cut = stratified_mean(answers, sizes, lambda a: float(a.cut_by(cap) if cap else a.at_budget))
    total = mean.value * requests
    wall_h = total / tokens_per_s / 3600 if tokens_per_s > 0 else None
    return {"output_tokens_mean": round(mean.value, 1), "cut_share": round(cut.value, 4),
            "cut_share_ci95": [round(max(cut.low, 0.0), 4), round(min(cut.high, 1.0), 4)],
            "output_tokens_total": round(total),
            "wall_h": None if wall_h is None else significant(wall_h),
            "gpu_hours": None if wall_h is None else significant(wall_h * gpus)}


def significant(x: float, digits: int = 4) -> float:
    """`x` to `digits` significant figures: hours of a day-long run and of a test's second."""
    return float(f"{x:.{digits}g}")


def project(answers: Sequence[Answer], sizes: Sequence[int], caps: Sequence[int],
            fleet: Fleet, failed: int) -> dict[str, Any]:
    """estimate.json's projection for `sum(sizes)` requests from the sample's answers."""
    requests = sum(sizes)
    gpus = fleet.engines * fleet.gpus_per_engine
    mean = stratified_mean(answers, sizes, lambda a: a.completion_tokens)
    p50, p90, p99 = weighted_quantiles(answers, sizes, (0.5, 0.9, 0.99))
    fast = speed(answers, fleet)
    uncapped = cap_row(answers, sizes, requests, None, fast["tokens_per_s"], gpus)
    by_cap = {str(c): cap_row(answers, sizes, requests, c, fast["tokens_per_s"], gpus)
              for c in caps}
    done = requests * (1 - failed / (len(answers) + failed)) if answers else 0
    plain = stratified_mean(answers, sizes, lambda a: a.line_bytes).value
    ids = stratified_mean(answers, sizes, lambda a: a.line_bytes + a.ids_bytes).value
    wall_h = uncapped["wall_h"]
    return {
        "output_tokens": {"mean": round(mean.value, 1),
                          "mean_ci95": [round(mean.low, 1), round(mean.high, 1)],
                          "p50": p50, "p90": p90, "p99": p99,
                          # The sample's longest: the input's is at least this, at most the
                          # largest budget.
                          "max": max(a.completion_tokens for a in answers),
                          "total": uncapped["output_tokens_total"],
                          "at_budget_share": uncapped["cut_share"]},
        "cut_share": {c: row["cut_share"] for c, row in by_cap.items()},
        "by_cap": {"none": uncapped, **by_cap},
        "fleet": {"engines": fleet.engines, "gpus": gpus, **fast},
        "wall_h": wall_h, "gpu_hours": uncapped["gpu_hours"],
        "rows_per_s_per_gpu": (round(requests / (wall_h * 3600) / gpus, 3)
                               if wall_h else None),
        "failed_share": round(failed / (len(answers) + failed), 4) if answers else None,
        "output_bytes": {"without_token_ids": round(done * plain),
                         "with_token_ids": round(done * ids)},
    }
