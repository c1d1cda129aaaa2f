"""SeenIds: exact membership across merges, the same answers as a plain set."""

from __future__ import annotations

import random

from producer.dedup import SeenIds


def test_same_answers_as_a_set_across_many_merges() -> None:
    seen, ref = SeenIds(recent_limit=64), set()
    rng = random.Random(3)
    for _ in range(5000):
        value = hash(f"id{rng.randint(0, 3000)}")
        assert seen.add(value) == (value not in ref)
        ref.add(value)
    assert len(seen) == len(ref)
    assert all(v in seen for v in ref)
    assert hash("never-added") not in seen


def test_negative_hashes_and_clear() -> None:
    seen = SeenIds(recent_limit=2)
    for value in (-1, 1, -(2**63), 2**63 - 1):
        assert seen.add(value)
        assert not seen.add(value)
    seen.clear()
    assert len(seen) == 0 and seen.add(-1)
