"""The held-out split (--holdout): which rows a run never sends, chosen by a hash of the row's id
alone, so the same rows are held out on every resume, every machine and every Python (the
builtin `hash` is salted per process: never that)."""

from __future__ import annotations

import hashlib

from fleetgen.records.outcomes import holdout_record
from producer.request import Request
from producer.rows import Row

__all__ = ["HoldOut", "held_out", "holdout_record"]

_SCALE = float(1 << 64)


def held_out(row_id: str, fraction: float) -> bool:
    """Whether the row with this id is in the held-out share `fraction` (0: none): the id's
    blake2b-64 read as a number in [0, 1), below the fraction."""
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(row_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE < fraction


class HoldOut:
    """The run's split: a row in it ends as one holdout line covering all its requests."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def takes(self, row: Row) -> bool:
        return held_out(row.id, self.fraction)

    @staticmethod
    def record(row: Row, requests: list[Request]) -> dict[str, object]:
        first = requests[0].slot
        return holdout_record(row.id, row.fields, row.line, first, len(requests))
