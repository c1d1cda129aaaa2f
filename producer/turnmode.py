"""How a run treats a row's turns, chosen once per run: `--turns last` (one request per sample,
answering the row's last user turn; settled by the workers' `done` bitmap) or `--turns all`
(every turn of every conversation, settled by the drainer's files: producer/allturns.py).
A turn mode numbers a row's requests and answers what the run object (producer/loop.py) asks
at each tick: how many slots are settled, which are lost; it never waits."""

from __future__ import annotations

from typing import Protocol

from producer.reconcile import Reconciler
from producer.request import Request
from producer.rows import BadRow, Row


class TurnMode(Protocol):
    def requests(self, item: Row | BadRow, first_slot: int,
                 default_n: int) -> tuple[Row | BadRow, list[Request]]:
        """The row as the pass sends it (a conversation cut to its first turn, or a bad row
        if it cannot be cut) and all its requests, numbered from `first_slot`."""
        ...

    def follow(self) -> int:
        """Send what became sendable since the last look (next turns); returns how many
        requests were sent or rejected."""
        ...

    def outstanding(self) -> int:
        """Outcomes the run still waits for beyond the settled count (read before `follow`
        and `settled`: see AllTurns)."""
        ...

    def settled(self) -> int:
        """Slots whose outcome stands."""
        ...

    def lost(self, total: int) -> set[int]:
        """Slots of 1..total that could go but have no outcome and are neither queued nor
        held by a worker (one look: the run object confirms them at the next)."""
        ...

    def first_turns(self, slots: set[int]) -> set[int]:
        """Those of `slots` a pass over the input sends (the rest are next turns)."""
        ...

    def resend(self, slots: set[int]) -> int:
        """Send these next turns again, built from the written turn before each."""
        ...


def samples(item: Row | BadRow, default_n: int) -> int:
    """How many samples of the row are asked for: its own `n`, else the run's."""
    return (item.n if isinstance(item, Row) else None) or default_n


class LastTurn:
    """`--turns last`: a row's samples are its requests, every one sent by the pass."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler

    def requests(self, item: Row | BadRow, first_slot: int,
                 default_n: int) -> tuple[Row | BadRow, list[Request]]:
        n = samples(item, default_n)
        return item, [Request(first_slot + k, k if n > 1 else None, item.line)
                      for k in range(n)]

    def follow(self) -> int:
        return 0

    def outstanding(self) -> int:
        return 0  # the bitmap is the settled count: nothing is on its way to it

    def settled(self) -> int:
        return self.reconciler.done_count()

    def lost(self, total: int) -> set[int]:
        return self.reconciler.lost_lines(total)

    def first_turns(self, slots: set[int]) -> set[int]:
        return slots

    def resend(self, slots: set[int]) -> int:
        return 0
