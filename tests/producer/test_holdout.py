"""The held-out split alone: a hash of the id, the same in every process (the builtin `hash` is
salted per process), the share asked for, and a larger fraction holding out a superset."""

from __future__ import annotations

import math
import os
import subprocess
import sys

from producer.holdout import held_out

IDS = [f"row-{i}" for i in range(20_000)]


def test_the_split_is_the_same_in_another_process_with_another_hash_seed() -> None:
    here = [i for i in IDS[:2000] if held_out(i, 0.1)]
    code = ("import sys; from producer.holdout import held_out; "
            "print('\\n'.join(f'row-{i}' for i in range(2000) if held_out(f'row-{i}', 0.1)))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert there.stdout.split() == here
    assert 150 < len(here) < 250


def test_the_share_is_the_fraction_within_three_sigma() -> None:
    for fraction in (0.01, 0.05, 0.2, 0.5):
        held = sum(held_out(i, fraction) for i in IDS)
        sigma = math.sqrt(len(IDS) * fraction * (1 - fraction))
        assert abs(held - fraction * len(IDS)) <= 3 * sigma, (fraction, held)


def test_no_fraction_holds_nothing_and_more_holds_a_superset() -> None:
    assert not any(held_out(i, 0.0) for i in IDS)
    small = {i for i in IDS if held_out(i, 0.05)}
    large = {i for i in IDS if held_out(i, 0.2)}
    assert small < large
