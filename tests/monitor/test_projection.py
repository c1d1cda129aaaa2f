"""The estimate's arithmetic alone: the cut share under censoring, the stratified mean and its
interval for the run's own mean (the answers' randomness in it: a stratum sampled whole
keeps its error), percentiles weighted by what each answer
stands for, and the fleet's speed by Little's law."""

from __future__ import annotations

import random

import pytest

from fleetgen.monitor.projection import (
    Answer,
    Fleet,
    project,
    stratified_mean,
    weighted_quantiles,
)


def answer(tokens: int, stratum: int = 0, at_budget: bool = False,
           latency_s: float = 1.0, start: float = 0.0) -> Answer:
    return Answer(stratum, tokens, at_budget, 1000, 7 * tokens, latency_s, start,
                  start + latency_s)


def test_an_answer_cut_at_its_budget_is_cut_by_every_cap() -> None:
    censored = answer(3000, at_budget=True)  # its prompt left 3,000 tokens: all used
    assert all(censored.cut_by(cap) for cap in (2048, 3000, 4096, 8192))
    natural = answer(3000)
    assert natural.cut_by(2048) and not natural.cut_by(3000) and not natural.cut_by(4096)
    assert natural.tokens_under(2048) == 2048 and natural.tokens_under(None) == 3000


def test_the_stratified_mean_weighs_strata_by_size_and_a_whole_stratum_keeps_its_error() -> None:
    answers = [answer(100, 0), answer(300, 0), answer(1000, 1), answer(1000, 1)]
    est = stratified_mean(answers, [2, 8], lambda a: a.completion_tokens)
    assert est.value == pytest.approx(0.2 * 200 + 0.8 * 1000)
    # Sampled whole, the run still draws every answer again: 2 s²/N, not 0.
    half = 1.96 * (0.2**2 * 2 * 20_000 / 2) ** 0.5
    assert est.high - est.value == pytest.approx(half)
    wider = stratified_mean(answers, [200, 8], lambda a: a.completion_tokens)
    assert wider.high - wider.low > 0


def test_an_estimate_of_the_whole_input_covers_the_runs_answers() -> None:
    """`mean 328 (95 % 328-328)` for a sample that was the whole input; the run then made
    +4.6 %. Each row's answer is a draw: the run's mean must be inside most of the time."""
    rng = random.Random(5)
    means = [rng.lognormvariate(5.5, 0.6) for _ in range(300)]  # each prompt's own length

    def answers() -> list[int]:
        return [int(rng.expovariate(1 / m)) + 1 for m in means]  # one draw of every row

    covered = 0
    for _ in range(200):
        sample = [answer(t) for t in answers()]
        est = stratified_mean(sample, [len(means)], lambda a: a.completion_tokens)
        run = answers()
        covered += est.low <= sum(run) / len(run) <= est.high
    assert covered / 200 >= 0.93, covered


def test_the_interval_covers_the_population_mean_most_of_the_time() -> None:
    rng = random.Random(3)
    population = [int(rng.lognormvariate(7, 1)) for _ in range(20_000)]
    truth = sum(population) / len(population)
    covered = 0
    for _ in range(200):
        sample = [answer(t) for t in rng.sample(population, 300)]
        est = stratified_mean(sample, [len(population)], lambda a: a.completion_tokens)
        covered += est.low <= truth <= est.high
    assert 0.88 <= covered / 200 <= 0.99, covered


def test_quantiles_weigh_each_answer_by_the_rows_it_stands_for() -> None:
    # Stratum 0: 1 answer standing for 90 rows; stratum 1: 1 answer for 10.
    answers = [answer(10, 0), answer(5000, 1)]
    assert weighted_quantiles(answers, [90, 10], (0.5, 0.89, 0.95)) == [10, 10, 5000]


def test_the_fleet_speed_is_a_requests_rate_times_the_slots() -> None:
    answers = [answer(1000, latency_s=2.0, start=float(i)) for i in range(4)]
    out = project(answers, [100_000], [512], Fleet(engines=2, gpus_per_engine=1, slots=16), 0)
    assert out["fleet"]["tokens_per_s"] == pytest.approx(500 * 16)
    assert out["by_cap"]["none"]["wall_h"] == pytest.approx(100_000 * 1000 / 8000 / 3600, 0.01)
    assert out["gpu_hours"] == pytest.approx(out["wall_h"] * 2, 0.05)
    assert out["cut_share"] == {"512": 1.0}
    assert out["output_bytes"]["with_token_ids"] == 100_000 * (1000 + 7000)


def test_a_busy_slots_rate_is_measured_where_the_fleet_was_full() -> None:
    # Two slots: the first 10 s both busy at 100 tokens/s each; then one alone, at 300/s
    # (an idle GPU decodes a lone request faster): the full fleet's rate is 2 x 100.
    answers = [answer(1000, latency_s=10.0), answer(1000, latency_s=10.0),
               answer(3000, latency_s=10.0, start=10.0)]
    out = project(answers, [100], [512], Fleet(engines=1, gpus_per_engine=1, slots=2), 0)
    assert out["fleet"]["saturated"] is True
    assert out["fleet"]["tokens_per_s"] == pytest.approx(200)
    unfilled = project(answers, [100], [512], Fleet(engines=1, gpus_per_engine=1, slots=4), 0)
    assert unfilled["fleet"]["saturated"] is False
    assert unfilled["fleet"]["tokens_per_s"] == pytest.approx(4 * 5000 / 30, 0.01)
