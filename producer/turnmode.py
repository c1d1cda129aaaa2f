"""How a run treats a row's turns, chosen once per run: `--turns last` (one request per sample,
answering the row's last user turn; the run waited for by the reconciler) or `--turns all`
(every turn of every conversation, producer/allturns.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from producer.affinity import Affinity
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
        """Between a pass's batches and while the queue is full: send what became sendable
        since the last look; returns how many requests were sent or rejected."""
        ...

    def wait(self, total: int, requeue: Callable[[set[int]], None],
             reassert: Callable[[], bool], interval_s: float,
             should_stop: Callable[[], bool],
             on_tick: Callable[[int, int], None] | None) -> int:
        """Stay until every one of `total` slots has its outcome, handing lost first turns to
        `requeue`; returns how many were re-enqueued."""
        ...


def samples(item: Row | BadRow, default_n: int) -> int:
    """How many samples of the row are asked for: its own `n`, else the run's."""
    return (item.n if isinstance(item, Row) else None) or default_n


class LastTurn:
    """`--turns last`: a row's samples are its requests, every one sent by the pass."""

    def __init__(self, reconciler: Reconciler, affinity: Affinity) -> None:
        self.reconciler = reconciler
        self.affinity = affinity

    def requests(self, item: Row | BadRow, first_slot: int,
                 default_n: int) -> tuple[Row | BadRow, list[Request]]:
        n = samples(item, default_n)
        return item, [Request(first_slot + k, k if n > 1 else None, item.line)
                      for k in range(n)]

    def follow(self) -> int:
        return 0

    def wait(self, total: int, requeue: Callable[[set[int]], None],
             reassert: Callable[[], bool], interval_s: float,
             should_stop: Callable[[], bool],
             on_tick: Callable[[int, int], None] | None) -> int:
        # The sweep: a lost or saturated worker's queue of first turns back to the shared one.
        return self.reconciler.wait_until_generated(requeue, total, reassert, interval_s,
                                                    should_stop, on_tick, self.affinity.sweep)
