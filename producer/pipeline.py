"""The producer's pipeline: rows -> render -> tokenize once -> budget -> enqueue or reject."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from fleetgen.base.contract import RunKeys, TaskPayload, slot_of
from fleetgen.base.outcomes import duplicate_record, rejected_record
from producer.affinity import Affinity
from producer.budget import Limits, budget
from producer.dedup import SeenIds
from producer.earlystop import EarlyStop, parse_rule
from producer.enqueue import Enqueuer
from producer.inputs import resolve_input
from producer.manifest import RunManifest
from producer.options import Request, RequestOptions
from producer.reconcile import Reconciler
from producer.rows import BadRow, Row, count_rows, parse_row, read_rows
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer
from producer.turns import WrittenTurns, answer_message, row_object, turn_messages, user_turns

log = logging.getLogger("fleetgen.producer")

# Longer than any token of the vocabularies we know (Qwen3.6's longest is 128 bytes).
MAX_BYTES_PER_TOKEN = 256


@dataclass
class Progress:
    read: int = 0
    enqueued: int = 0
    rejected: int = 0
    skipped: int = 0  # already done or in flight from an earlier invocation
    requeued: int = 0  # lost rows enqueued again while waiting (see wait_until_generated)
    stopped: str | None = None  # why --stop-if stopped the run, if it did
    started_s: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s


class Producer:
    def __init__(self, settings: ProducerSettings, tokenizer: PromptTokenizer,
                 client: redis.Redis, enqueuer: Enqueuer, limits: Limits) -> None:
        self.s = settings
        self.tokenizer = tokenizer
        self.redis = client
        self.enqueuer = enqueuer
        self.limits = limits
        self.keys = RunKeys(settings.run)
        self.run_manifest = RunManifest(client, settings.run, settings.new_run)
        self.reconciler = Reconciler(client, settings.run)
        self.affinity = Affinity(client, enabled=settings.affinity,
                                 wait_s=settings.affinity_wait_s)
        self.progress = Progress()
        # Resolved once: every pass of this producer reads the same files, in the same order.
        self.inputs = resolve_input(settings.input)
        self._seen_ids = SeenIds()  # ~8 bytes a row (bench/memory.py)
        self._settings: dict[str, Any] = {}
        self._next_slot = 1
        self.options = RequestOptions(settings, tokenizer, limits)
        rules = [] if settings.ignore_stop else [parse_rule(r) for r in settings.stop_if]
        self.early = EarlyStop(client, settings.run, rules, settings.stop_after)
        self.total: int | None = None  # rows in the input, once all of it has been read
        # `--turns all`: the drainer's files, followed for the answers each next turn is built
        # from; the slots of every conversation's first turn (a bit each), for reconciling.
        self.written: WrittenTurns | None = None
        if settings.turns == "all":
            assert settings.out is not None
            self.written = WrittenTurns(settings.out, settings.run)
            self.written.check_owner()
        self._first_turns = bytearray()
        self._followed = False  # the files have been read once by this process

    # -- the run ---------------------------------------------------------------------------
    def run(self, on_batch: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> Progress:
        """Enqueue every row that is neither done nor in flight (all of them on a first run;
        what an interrupted run left on a resumed one), then mark the run produced."""
        settings = self.s.manifest_settings(files=self.inputs.names)
        settings["context_length"] = self.limits.context_length
        self._settings = settings
        stopped = self.run_manifest.stop_reason()
        if stopped is not None and not self.s.ignore_stop:
            self.progress.stopped = stopped  # stopped before: say so, change nothing
            return self.progress
        # The size before reading, not after: a row appended while this pass reads may be
        # missed by it, and must then count as a change the next `produce` reads again.
        input_bytes = self.inputs.size_bytes()
        self.run_manifest.open(settings, count_rows(self.inputs) * self.s.n)
        done = self.reconciler.done()
        in_flight = self.reconciler.in_flight()
        self._pass(lambda line: line not in done and line not in in_flight, on_batch,
                   should_stop)
        if self.early.verdict is not None:
            self._stop_early(self.early.verdict.reason(), should_stop)
        elif not should_stop():
            self.total = self._next_slot - 1  # requests: rows x samples
            self.run_manifest.close(self.total, input_bytes)
        return self.progress

    def _stop_early(self, reason: str, should_stop: Callable[[], bool]) -> None:
        """Enqueue nothing more, let what is queued or in flight finish, then report."""
        log.warning("stopping the run early: %s", reason)
        self.run_manifest.stop(reason)
        self.progress.stopped = reason
        keys = self.keys
        while not should_stop() and self.redis.bitcount(keys.done) < self.redis.bitcount(
                keys.sent):
            time.sleep(0.2)

    def requeue(self, lines: set[int], should_stop: Callable[[], bool] = lambda: False) -> None:
        """Enqueue these lines again (a pass over the input that keeps only them)."""
        self._pass(lines.__contains__, None, should_stop)

    def _pass(self, wanted: Callable[[int], bool],
              on_batch: Callable[[Progress], None] | None,
              should_stop: Callable[[], bool]) -> None:
        self.progress = Progress()
        self._seen_ids.clear()
        self._next_slot = 1

        def stop() -> bool:
            return should_stop() or self.early.triggered()

        for chunk in _batched(read_rows(self.inputs), self.s.batch_size):
            if stop():
                return
            # Next turns go out while the input is still being read (no waves): they are
            # built whenever the files gain an answer, also while the queue is full.
            self.enqueuer.wait_for_room(stop, while_full=self.follow_turns)
            if stop():
                return
            payloads, rejections = self._prepare(chunk, wanted)
            self.enqueuer.reject(rejections)
            self.enqueuer.send(payloads)
            self.progress.enqueued += len(payloads)
            self.progress.rejected += len(rejections)
            self.run_manifest.record_read(self._next_slot - 1)
            self.follow_turns()
            if on_batch:
                on_batch(self.progress)

    # -- reconciliation (producer/reconcile.py) ---------------------------------------------
    # The producer is the one that knows the input and its total: while it waits it writes
    # them back whenever Redis forgets them (restarted from an older copy of its data).
    def lost_lines(self) -> set[int]:
        assert self.total is not None, "run() first: the total is known once all is read"
        return self.reconciler.lost_lines(self.total)

    def wait_until_generated(self, interval_s: float = 30.0,
                             should_stop: Callable[[], bool] = lambda: False,
                             on_tick: Callable[[int, int], None] | None = None) -> int:
        total = self.total
        assert total is not None, "run() first: the total is known once all is read"
        if self.written is not None:
            return self.wait_for_turns(interval_s, should_stop, on_tick)
        return self.reconciler.wait_until_generated(
            lambda lines: self.requeue(lines, should_stop), total,
            lambda: self.run_manifest.reassert(self._settings, total), interval_s,
            should_stop, on_tick)

    def manifest(self) -> dict[str, str]:
        return self.run_manifest.read()

    # -- --turns all: the next turns, from what the drainer wrote -----------------------------
    def follow_turns(self) -> int:
        """Build and enqueue the next turn of every conversation whose turn the files gained
        since the last look; returns how many were sent or rejected. The first look of this
        process reads the files whole and skips what is queued or held by a worker (an
        earlier producer may have sent it); later looks see lines no one has seen."""
        if self.written is None:
            return 0
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
        assert self.written is not None
        todo: list[tuple[Row, str, list[Request]]] = []
        rejections: list[dict[str, Any]] = []
        answered_by = {slot_of(r) + 1: r.get("worker") for r in records}
        for record in records:
            row = parse_row(int(record["line"]), row_object(record),
                            source=record.get("file"), position=record.get("position"))
            turn, turns = int(record["turn"]) + 1, int(record["turns"])
            request = Request(slot_of(record) + 1, record.get("sample"), int(record["line"]),
                              turn, turns)
            if isinstance(row, BadRow) or row.messages is None:
                continue  # cannot be: the row was good when its first turn was sent
            try:
                answers = [answer_message(r) for r in self.written.history(record)]
                messages = turn_messages(user_turns(row.messages), answers)
            except ValueError as exc:
                rejections += _ending(row, [request], f"bad_turns: {exc}")
                continue
            self._render_or_reject(replace(row, messages=messages), [request], todo, rejections)
        payloads = self._budget(todo, rejections)
        self.enqueuer.reject(rejections)
        self.enqueuer.send_next(payloads, self.affinity.routes(payloads, answered_by))
        self.progress.enqueued += len(payloads)
        self.progress.rejected += len(rejections)
        return len(payloads) + len(rejections)

    def wait_for_turns(self, interval_s: float, should_stop: Callable[[], bool],
                       on_tick: Callable[[int, int], None] | None) -> int:
        """--turns all: wait until every slot is settled in the files (written, or held back
        by a failed turn), building next turns as answers land, and re-enqueueing, at two
        checks in a row, a turn that could go (first turns, and next turns of written ones)
        but has no outcome and is neither queued nor held (Redis lost it)."""
        assert self.written is not None and self.total is not None
        total, suspects, requeued = self.total, set[int](), 0
        next_check = time.monotonic() + interval_s
        while not should_stop():
            try:
                self.run_manifest.reassert(self._settings, total)
                self.affinity.sweep()  # a lost worker's next turns, to the shared queue
                self.follow_turns()
                settled = self.written.settled()
                if on_tick:
                    on_tick(settled, total)
                # A turn `fleetgen retry` sent back is settled in the files (its failure) but
                # not done: its conversation may go on.
                if settled >= total and not self.redis.scard(self.keys.retrying):
                    break
                if time.monotonic() >= next_check:
                    lost = self._lost_turns()
                    confirmed, suspects = lost & suspects, lost - (lost & suspects)
                    requeued += self._requeue_turns(confirmed, should_stop)
                    next_check = time.monotonic() + interval_s
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("Redis unreachable while waiting for the run (%s); retrying", exc)
            time.sleep(min(0.5, interval_s, self.affinity.wait_s))
        return requeued

    def _lost_turns(self) -> set[int]:
        assert self.written is not None and self.total is not None
        written = self.written
        done = self.reconciler.done()
        candidates = set(written.pending)
        candidates.update(n for n in range(1, self.total + 1)
                          if _bit(self._first_turns, n) and not written.has(n))
        lost = {n for n in candidates if n not in done and not written.has(n)}
        return lost - self.reconciler.in_flight() if lost else lost

    def _requeue_turns(self, slots: set[int], should_stop: Callable[[], bool]) -> int:
        if not slots:
            return 0
        assert self.written is not None
        log.warning("re-enqueueing %d turn(s) that were lost (neither queued, in flight nor "
                    "done)", len(slots))
        first = {n for n in slots if _bit(self._first_turns, n)}
        if first:
            self.requeue(first, should_stop)
        later = [self.written.read_at(self.written.pending[n]) for n in slots - first
                 if n in self.written.pending]
        self._send_next(later)
        return len(slots)

    # -- one batch -------------------------------------------------------------------------
    def _prepare(self, chunk: list[Row | BadRow],
                 wanted: Callable[[int], bool]) -> tuple[list[TaskPayload], list[dict[str, Any]]]:
        rejections: list[dict[str, Any]] = []
        todo: list[tuple[Row, str, list[Request]]] = []
        for item in chunk:
            self.progress.read += 1
            duplicate = self._is_duplicate(item.id)
            item, turns = self._split_turns(item)
            requests = self._requests(item, len(turns) if turns else 1)
            pending = [r for r in requests if wanted(r.slot)]
            self.progress.skipped += len(requests) - len(pending)
            if not pending:
                continue
            if duplicate:
                rejections += [r.mark(duplicate_record(
                    item.id, item.line, file=item.source, position=item.position)) for r in pending]
            elif isinstance(item, BadRow):
                rejections += [r.mark(_rejected(item, item.reason)) for r in pending]
            else:
                # With --turns all the pass sends first turns; the next ones are built from
                # the answers written (follow_turns).
                pending = [r for r in pending if r.turn in (None, 1)]
                first = item if turns is None else replace(item, messages=turns[0])
                if pending:
                    self._render_or_reject(first, pending, todo, rejections)
        return self._budget(todo, rejections), rejections

    def _split_turns(self, item: Row | BadRow
                     ) -> tuple[Row | BadRow, list[list[dict[str, Any]]] | None]:
        """With --turns all, a conversation's user turns (None: not a conversation, one
        turn); a conversation that cannot be cut into turns becomes a bad row."""
        if self.written is None or not isinstance(item, Row) or item.messages is None:
            return item, None
        try:
            return item, user_turns(item.messages)
        except ValueError as exc:
            return BadRow(item.line, str(exc), item.id, item.source, item.position), None

    def _requests(self, item: Row | BadRow, turns: int = 1) -> list[Request]:
        """The requests of one row: one per sample (and per turn with --turns all, a sample's
        turns consecutive), numbered on from the previous row's, so the same input and
        settings always give every request the same slot."""
        n = (item.n if isinstance(item, Row) else None) or self.s.n
        first = self._next_slot
        if self.written is None:
            self._next_slot += n
            return [Request(first + k, k if n > 1 else None, item.line) for k in range(n)]
        self._next_slot += n * turns
        requests = [Request(first + k * turns + t, k if n > 1 else None, item.line, t + 1, turns)
                    for k in range(n) for t in range(turns)]
        for r in requests:
            if r.turn == 1:
                _set_bit(self._first_turns, r.slot)
        return requests

    def _render_or_reject(self, row: Row, requests: list[Request],
                          todo: list[tuple[Row, str, list[Request]]],
                          rejections: list[dict[str, Any]]) -> None:
        try:
            text = self._render(row)
        except ValueError as exc:
            rejections += _ending(row, requests, f"bad_messages: {exc}")
            return
        # No token is longer than MAX_BYTES_PER_TOKEN bytes (and a character is at least one
        # byte), so a text this long cannot fit: reject it without paying to tokenize it.
        if len(text) > MAX_BYTES_PER_TOKEN * self.limits.max_req_input_len:
            reason = (f"prompt_too_long: {len(text)} characters cannot fit in a "
                      f"{self.limits.context_length}-token context")
            rejections += _ending(row, requests, reason)
            return
        todo.append((row, text, requests))

    def _budget(self, todo: list[tuple[Row, str, list[Request]]],
                rejections: list[dict[str, Any]]) -> list[TaskPayload]:
        payloads: list[TaskPayload] = []
        ids_batch = self.tokenizer.encode_batch([text for _, text, _ in todo]) if todo else []
        for (row, text, requests), input_ids in zip(todo, ids_batch, strict=True):
            b = budget(len(input_ids), self.limits)
            if b.reason is not None:
                turn = requests[0].turn or 1
                reason = b.reason if turn == 1 else \
                    f"context_full_at_turn: turn {turn}'s prompt (with the answers before it) " \
                    f"does not fit: {b.reason}"
                rejections += _ending(row, requests, reason, len(input_ids))
                continue
            max_tokens = b.max_tokens if row.max_tokens is None else \
                min(b.max_tokens, row.max_tokens)
            for request in requests:
                payloads.append(self.options.payload(row, request, input_ids, max_tokens, text))
        return payloads

    def _render(self, row: Row) -> str:
        return render_row(self.tokenizer, row)

    def _is_duplicate(self, row_id: str) -> bool:
        """First occurrence wins. 64-bit hashes, not the ids themselves."""
        return not self._seen_ids.add(hash(row_id))


def _ending(row: Row, requests: list[Request], reason: str,
            prompt_tokens: int | None = None) -> list[dict[str, Any]]:
    """Rejections of these requests and, with --turns all, of the later turns of their
    conversations, which end here (every turn of a conversation has its one outcome)."""
    records = []
    for request in requests:
        records.append(request.mark(_rejected(row, reason, prompt_tokens)))
        for later in request.later():
            records.append(later.mark(_rejected(row, (
                f"conversation_ended: turn {request.turn} was rejected "
                f"({reason.split(':', 1)[0]})"))))
    return records


def _bit(bits: bytearray, n: int) -> bool:
    return (n >> 3) < len(bits) and bool(bits[n >> 3] & (0x80 >> (n & 7)))


def _set_bit(bits: bytearray, n: int) -> None:
    if (n >> 3) >= len(bits):
        bits.extend(bytes(max((n >> 3) + 1 - len(bits), len(bits))))
    bits[n >> 3] |= 0x80 >> (n & 7)


def render_row(tokenizer: PromptTokenizer, row: Row) -> str:
    """The text whose ids are sent for a row: a raw `prompt` as it is, messages through the
    chat template with the row's own `chat_template_kwargs` over the run's. The one rendering
    the producer and `fleetgen export --format tokens` (which re-renders prompts) share."""
    if row.prompt is not None:
        return row.prompt
    assert row.messages is not None
    return tokenizer.render(row.messages, row.template_kwargs)


def _rejected(item: Row | BadRow, reason: str,
              prompt_tokens: int | None = None) -> dict[str, Any]:
    return rejected_record(item.id, item.line, reason, prompt_tokens, file=item.source,
                           position=item.position)


def _batched(items: Iterable[Row | BadRow], size: int) -> Iterator[list[Row | BadRow]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk
