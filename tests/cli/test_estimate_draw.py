"""`fleetgen estimate`'s sample (fleetgen/cli/estimate.py draw): equal-count strata of prompt
length, each sampled in proportion to its size, the same rows for the same seed, and the
requests each stratum stands for summing to the input's."""

from __future__ import annotations

import random

from fleetgen.cli.estimate import Survey, draw


def survey(rows: int) -> Survey:
    rng = random.Random(7)
    s = Survey(rows=rows)
    for i in range(rows):
        s.lines.append(2 * i + 1)  # lines are not indices: the bad ones are not in the survey
        s.prompt_tokens.append(rng.randint(10, 4000))
        s.requests.append(rng.choice((1, 1, 2, 4)))  # a row's own n
    return s


def test_the_strata_split_the_input_by_prompt_length_and_weigh_its_requests() -> None:
    s = survey(1000)
    chosen, sizes = draw(s, 200, seed=3)
    assert len(sizes) == 10 and sum(sizes) == sum(s.requests)
    assert 190 <= len(chosen) <= 210 and set(chosen.values()) == set(range(10))
    length = {line: s.prompt_tokens[i] for i, line in enumerate(s.lines)}
    by_stratum: dict[int, list[int]] = {}
    for line, h in chosen.items():
        by_stratum.setdefault(h, []).append(length[line])
    assert all(18 <= len(v) <= 22 for v in by_stratum.values())  # 100 rows each: 20 drawn
    # Equal-count strata of prompt length: each one's prompts are at least the last one's.
    for h in range(1, 10):
        assert min(by_stratum[h]) >= max(by_stratum[h - 1])
    assert draw(s, 200, seed=3) == (chosen, sizes)
    assert draw(s, 200, seed=4)[0] != chosen


def test_a_small_sample_or_input_has_fewer_strata() -> None:
    s = survey(1000)
    chosen, sizes = draw(s, 50, seed=0)
    assert len(sizes) == 2 and sum(sizes) == sum(s.requests) and len(chosen) == 50
    every, sizes = draw(survey(3), 500, seed=0)  # no more strata than rows: all drawn
    assert len(sizes) == 3 and sorted(every) == [1, 3, 5]
