"""`--turns all`: every turn of every conversation is a request of its own, in order. The pass
over the input sends first turns; this follows the drainer's files and sends each next turn
once the answer before it is written, rendered with this run's answers (docs/design.md "Every
turn"), and tells the run object (producer/loop.py) which turns the files settle and which
Redis lost."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fleetgen.queue.contract import slot_of
from fleetgen.runstate.bitmap import Bits
from producer.outbox import Outbox
from producer.prompts import PromptBatch, Prompts
from producer.reconcile import Reconciler
from producer.request import Request
from producer.rows import BadRow, Row, parse_row
from producer.turnmode import samples
from producer.turns import WrittenTurns, answer_message, row_object, turn_messages, user_turns


class AllTurns:
    """The conversation follower: numbers a conversation's turns into consecutive slots (a
    sample's turns together), remembers which slots are first turns (a bit each, for
    reconciling), builds next turns from the written answers, says which turns are settled
    and which were lost."""

    def __init__(self, written: WrittenTurns, reconciler: Reconciler, prompts: Prompts,
                 outbox: Outbox) -> None:
        self.written = written
        self.reconciler = reconciler
        self.prompts = prompts
        self.outbox = outbox
        self._first_turns = Bits()
        self._followed = False  # the files have been read once by this process

    # -- the pass's side: a conversation's requests ------------------------------------------
    def requests(self, item: Row | BadRow, first_slot: int,
                 default_n: int) -> tuple[Row | BadRow, list[Request]]:
        turns = None
        if isinstance(item, Row) and item.messages is not None:
            try:
                turns = user_turns(item.messages)
            except ValueError as exc:
                item = BadRow(item.line, str(exc), item.id, item.source, item.position)
        n, count = samples(item, default_n), len(turns) if turns else 1
        requests = [Request(first_slot + k * count + t, k if n > 1 else None, item.line,
                            t + 1, count) for k in range(n) for t in range(count)]
        for request in requests:
            if request.turn == 1:
                self._first_turns.add(request.slot)
        if turns is not None and isinstance(item, Row):
            item = replace(item, messages=turns[0])
        return item, requests

    # -- next turns, from what the drainer wrote ---------------------------------------------
    def follow(self) -> int:
        """Build and enqueue the next turn of every conversation whose turn the files gained
        since the last look; returns how many were sent or rejected. The first look of this
        process reads the files whole and skips what is queued or held by a worker (an
        earlier producer may have sent it); later looks see lines no one has seen."""
        grown = self.written.poll()
        if not grown:
            self._followed = True
            return 0
        done = self.reconciler.done()
        in_flight = set() if self._followed else self.reconciler.in_flight()
        self._followed = True
        todo = [r for r in grown if (slot_of(r) + 1) not in done
                and (slot_of(r) + 1) not in in_flight and not self.written.has(slot_of(r) + 1)]
        return self._send_next(todo)

    def _send_next(self, records: list[dict[str, Any]]) -> int:
        """The next turn of each of these written turns: rendered with the answers before it,
        budgeted on its own prompt, enqueued at the front of the queue (or rejected)."""
        batch = self.prompts.batch()
        for record in records:
            self._add_next(batch, record)
        payloads = batch.payloads()
        answered_by = {slot_of(r) + 1: r.get("worker") for r in records}
        return self.outbox.send_next(payloads, batch.rejections, answered_by)

    def _add_next(self, batch: PromptBatch, record: dict[str, Any]) -> None:
        row = parse_row(int(record["line"]), row_object(record),
                        source=record.get("file"), position=record.get("position"))
        request = Request(slot_of(record) + 1, record.get("sample"), int(record["line"]),
                          int(record["turn"]) + 1, int(record["turns"]))
        if isinstance(row, BadRow) or row.messages is None:
            return  # cannot be: the row was good when its first turn was sent
        try:
            answers = [answer_message(r) for r in self.written.history(record)]
            messages = turn_messages(user_turns(row.messages), answers)
        except ValueError as exc:
            batch.end(row, [request], f"bad_turns: {exc}")
            return
        batch.add(replace(row, messages=messages), [request])

    # -- settled and lost, for the run object ---------------------------------------------
    def outstanding(self) -> int:
        """Read before the files (`settled`): a turn `fleetgen retry` sent back is settled in
        them (its failure) but not done, and once its answer is recorded it is settled there
        still until the drainer writes the answer, which un-blocks the turns after it: the
        run is over only when the files have nothing more to gain."""
        return self.reconciler.unwritten()

    def settled(self) -> int:
        return self.written.settled()

    def lost(self, total: int) -> set[int]:
        """Turns that could go (first turns, and next turns of written ones) but have no
        outcome and are neither queued nor held. The first turns' bitmap is scanned by its
        set bytes only."""
        written = self.written
        done = self.reconciler.done()
        candidates = set(written.pending)
        candidates.update(n for n in self._first_turns.set_in(1, total) if not written.has(n))
        lost = {n for n in candidates if n not in done and not written.has(n)}
        return lost - self.reconciler.in_flight() if lost else lost

    def first_turns(self, slots: set[int]) -> set[int]:
        return {n for n in slots if n in self._first_turns}

    def resend(self, slots: set[int]) -> int:
        """Next turns built again from the written turn before."""
        later = [self.written.read_at(self.written.pending[n]) for n in slots
                 if n in self.written.pending]
        return self._send_next(later) if later else 0
