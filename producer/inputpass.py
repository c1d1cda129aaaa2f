"""One pass over the input, in batches: each row's requests numbered into slots (the same input
and settings give every request the same slot), the wanted ones rendered, tokenized and
budgeted as one batch, their first turns enqueued and the rest rejected. A first pass wants
what is neither done nor in flight; a re-enqueueing pass wants only the slots Redis lost. The
run object (producer/loop.py) drives it batch by batch, and looks at the run between them."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fleetgen.queue.contract import TaskPayload
from fleetgen.records.outcomes import duplicate_record
from producer.dedup import SeenIds
from producer.holdout import HoldOut
from producer.inputs import Inputs
from producer.manifest import CheckedManifest
from producer.outbox import Outbox
from producer.progress import Progress
from producer.prompts import PromptBatch, Prompts, rejected
from producer.request import Request
from producer.reuse import EarlierAnswers
from producer.rows import BadRow, Row, read_rows
from producer.turnmode import TurnMode

# The first batch of a pass: the next ones double up to the batch size (--batch-size), so the
# fleet gets its first prompts once this many rows are rendered and tokenized, not a whole
# batch (issue 48: 512 varied prompts took 0.3-0.4 s on the fleet bench before anything was
# queued, every GPU idle meanwhile). Five more batches a pass, each a round trip.
FIRST_BATCH = 16


@dataclass(frozen=True)
class PassParts:
    """Where a pass's rows go: rendered and budgeted (`prompts`), numbered into requests
    (`turns`), answered by earlier answers where they stand for them (`reuse`), the rest sent
    (`outbox`), counted as read (`manifest`)."""

    prompts: Prompts
    outbox: Outbox
    turns: TurnMode
    manifest: CheckedManifest
    reuse: EarlierAnswers | None = None


class InputPass:
    def __init__(self, inputs: Inputs, batch_size: int, default_n: int, parts: PassParts,
                 seen_ids: SeenIds, holdout: HoldOut | None = None) -> None:
        self.inputs = inputs
        self.batch_size = batch_size
        self.default_n = default_n  # --n: samples of a row that does not say
        self.prompts = parts.prompts
        self.outbox = parts.outbox
        self.turns = parts.turns
        self.manifest = parts.manifest
        self.reuse = parts.reuse
        self.seen_ids = seen_ids  # ~8 bytes a row (bench/memory.py)
        self.holdout = holdout or HoldOut(0.0)
        self.next_slot = 1

    @property
    def slots_read(self) -> int:
        """The requests of the rows read so far (rows x samples, x turns with --turns all)."""
        return self.next_slot - 1

    def chunks(self) -> Iterator[list[Row | BadRow]]:
        """A new pass over the input: its rows in batches, numbered from slot 1 again."""
        self.seen_ids.clear()
        self.next_slot = 1
        return _batched(read_rows(self.inputs), self.batch_size)

    def send(self, chunk: list[Row | BadRow], wanted: Callable[[int], bool],
             progress: Progress) -> None:
        """One batch: its wanted first turns enqueued, the rest rejected, held out or
        answered by an earlier answer (after the budget: whether one stands for a request
        depends on the request as it would be sent)."""
        payloads, rejections, held = self._prepare(chunk, wanted, progress)
        self.outbox.hold_out(held)
        if self.reuse is not None:
            payloads, reused = self.reuse.split(payloads)
            self.outbox.reuse(reused)
        self.outbox.send_first(payloads, rejections)
        self.manifest.record_read(self.slots_read)

    def _prepare(self, chunk: list[Row | BadRow], wanted: Callable[[int], bool],
                 progress: Progress
                 ) -> tuple[list[TaskPayload], list[dict[str, Any]], list[dict[str, Any]]]:
        batch = self.prompts.batch()
        held: list[dict[str, Any]] = []
        for item in chunk:
            progress.read += 1
            duplicate = self._is_duplicate(item.id)
            row = item  # as it was read: a held-out conversation is written whole
            item, requests = self.turns.requests(item, self.next_slot, self.default_n)
            self.next_slot += len(requests)
            pending = [r for r in requests if wanted(r.slot)]
            progress.skipped += len(requests) - len(pending)
            if not pending:
                continue
            if isinstance(row, Row) and not duplicate and self.holdout.takes(row):
                # One line for all the row's requests (its samples, its turns).
                held.append(self.holdout.record(row, requests))
            else:
                add_to_batch(batch, item, pending, duplicate)
        return batch.payloads(), batch.rejections, held

    def _is_duplicate(self, row_id: str) -> bool:
        """First occurrence wins. 64-bit hashes, not the ids themselves."""
        return not self.seen_ids.add(hash(row_id))


def add_to_batch(batch: PromptBatch, item: Row | BadRow, pending: list[Request],
                 duplicate: bool) -> None:
    """A row's wanted requests into the batch: rejected as a duplicate id or a bad row, else
    its first turns to render and budget (`fleetgen estimate` surveys rows the same way)."""
    if duplicate:
        batch.reject([r.mark(duplicate_record(item.id, item.line, file=item.source,
                                              position=item.position)) for r in pending])
    elif isinstance(item, BadRow):
        batch.reject([r.mark(rejected(item, item.reason)) for r in pending])
    else:
        # A pass sends first turns; with --turns all the next ones are built from the
        # answers written (producer/allturns.py).
        first = [r for r in pending if r.turn in (None, 1)]
        if first:
            batch.add(item, first)


def _batched(items: Iterable[Row | BadRow], size: int) -> Iterator[list[Row | BadRow]]:
    """Batches of `size` rows, the first ones smaller (FIRST_BATCH, doubling up to `size`)."""
    it = iter(items)
    n = min(FIRST_BATCH, size)
    while chunk := list(itertools.islice(it, n)):
        yield chunk
        n = min(2 * n, size)
