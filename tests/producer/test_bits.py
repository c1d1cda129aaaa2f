"""The producer's view of a Redis bitmap (resume and reconciliation read it)."""

from __future__ import annotations

import random

from fleetgen.runstate.bitmap import Bits


def test_bits_missing_matches_a_plain_scan() -> None:
    rng = random.Random(3)
    raw = bytes(rng.choice([0xFF, 0xFF, 0xFF, 0x00, rng.randrange(256)]) for _ in range(500))
    bits = Bits(raw)
    for first, last in ((1, 3999), (5, 4100), (17, 17)):
        assert list(bits.missing(first, last)) == [
            n for n in range(first, last + 1) if n not in bits]
