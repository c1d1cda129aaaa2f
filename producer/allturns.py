"""`--turns all`: every turn of every conversation is a request of its own, in order. The pass
over the input sends first turns; this follows the drainer's files and sends each next turn
once the answer before it is written, rendered with this run's answers (docs/design.md "Every
turn"), and waits for the run by the files, re-enqueueing a turn that Redis lost."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from fleetgen.base.contract import slot_of
from producer.affinity import Affinity
from producer.outbox import Outbox
from producer.prompts import PromptBatch, Prompts
from producer.reconcile import Reconciler
from producer.request import Request
from producer.rows import BadRow, Row, parse_row
from producer.turnmode import samples
from producer.turns import WrittenTurns, answer_message, row_object, turn_messages, user_turns

log = logging.getLogger("fleetgen.producer")


class AllTurns:
    """The conversation follower: numbers a conversation's turns into consecutive slots (a
    sample's turns together), remembers which slots are first turns (a bit each, for
    reconciling), builds next turns from the written answers and waits for the run."""

    def __init__(self, written: WrittenTurns, reconciler: Reconciler, prompts: Prompts,
                 outbox: Outbox, affinity: Affinity) -> None:
        self.written = written
        self.reconciler = reconciler
        self.prompts = prompts
        self.outbox = outbox
        self.affinity = affinity
        self._first_turns = bytearray()
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
                _set_bit(self._first_turns, request.slot)
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

    # -- waiting for the run -----------------------------------------------------------------
    def wait(self, total: int, requeue: Callable[[set[int]], None],
             reassert: Callable[[], bool], interval_s: float,
             should_stop: Callable[[], bool],
             on_tick: Callable[[int, int], None] | None) -> int:
        """Wait until every slot is settled in the files (written, or held back by a failed
        turn), building next turns as answers land, and re-enqueueing, at two checks in a
        row, a turn that could go (first turns, and next turns of written ones) but has no
        outcome and is neither queued nor held (Redis lost it)."""
        suspects, requeued = set[int](), 0
        next_check = time.monotonic() + interval_s
        while not should_stop():
            try:
                reassert()
                self.affinity.sweep()  # a lost worker's next turns, to the shared queue
                # Read before the files: a turn `fleetgen retry` sent back is settled in them
                # (its failure) but not done, and once its answer is recorded it is settled
                # there still until the drainer writes the answer, which un-blocks the turns
                # after it: the run is over only when the files have nothing more to gain.
                unwritten = self.reconciler.unwritten()
                self.follow()
                settled = self.written.settled()
                if on_tick:
                    on_tick(settled, total)
                if settled >= total and not unwritten:
                    break
                if time.monotonic() >= next_check:
                    lost = self._lost(total)
                    confirmed, suspects = lost & suspects, lost - (lost & suspects)
                    requeued += self._requeue(confirmed, requeue)
                    next_check = time.monotonic() + interval_s
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("Redis unreachable while waiting for the run (%s); retrying", exc)
            time.sleep(min(0.5, interval_s, self.affinity.wait_s))
        return requeued

    def _lost(self, total: int) -> set[int]:
        written = self.written
        done = self.reconciler.done()
        candidates = set(written.pending)
        candidates.update(n for n in range(1, total + 1)
                          if _bit(self._first_turns, n) and not written.has(n))
        lost = {n for n in candidates if n not in done and not written.has(n)}
        return lost - self.reconciler.in_flight() if lost else lost

    def _requeue(self, slots: set[int], requeue: Callable[[set[int]], None]) -> int:
        """First turns through a pass over the input that keeps only them; next turns built
        again from the written turn before."""
        if not slots:
            return 0
        log.warning("re-enqueueing %d turn(s) that were lost (neither queued, in flight nor "
                    "done)", len(slots))
        first = {n for n in slots if _bit(self._first_turns, n)}
        if first:
            requeue(first)
        later = [self.written.read_at(self.written.pending[n]) for n in slots - first
                 if n in self.written.pending]
        self._send_next(later)
        return len(slots)


def _bit(bits: bytearray, n: int) -> bool:
    return (n >> 3) < len(bits) and bool(bits[n >> 3] & (0x80 >> (n & 7)))


def _set_bit(bits: bytearray, n: int) -> None:
    if (n >> 3) >= len(bits):
        bits.extend(bytes(max((n >> 3) + 1 - len(bits), len(bits))))
    bits[n >> 3] |= 0x80 >> (n & 7)
