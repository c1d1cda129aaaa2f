"""The producer's pipeline: rows -> render -> tokenize once -> budget -> enqueue or reject."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from fleetgen.base.contract import RunKeys, TaskPayload
from fleetgen.base.outcomes import duplicate_record, rejected_record
from producer.budget import Limits, budget
from producer.dedup import SeenIds
from producer.earlystop import EarlyStop, parse_rule
from producer.enqueue import Enqueuer
from producer.inputs import resolve_input
from producer.manifest import RunManifest
from producer.options import Request, RequestOptions
from producer.reconcile import Reconciler
from producer.rows import BadRow, Row, count_rows, read_rows
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer

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
        self.run_manifest = RunManifest(client, settings.run)
        self.reconciler = Reconciler(client, settings.run)
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
            self.enqueuer.wait_for_room(stop)
            if stop():
                return
            payloads, rejections = self._prepare(chunk, wanted)
            self.enqueuer.reject(rejections)
            self.enqueuer.send(payloads)
            self.progress.enqueued += len(payloads)
            self.progress.rejected += len(rejections)
            self.run_manifest.record_read(self._next_slot - 1)
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
        return self.reconciler.wait_until_generated(
            lambda lines: self.requeue(lines, should_stop), total,
            lambda: self.run_manifest.reassert(self._settings, total), interval_s,
            should_stop, on_tick)

    def manifest(self) -> dict[str, str]:
        return self.run_manifest.read()

    # -- one batch -------------------------------------------------------------------------
    def _prepare(self, chunk: list[Row | BadRow],
                 wanted: Callable[[int], bool]) -> tuple[list[TaskPayload], list[dict[str, Any]]]:
        rejections: list[dict[str, Any]] = []
        todo: list[tuple[Row, str, list[Request]]] = []
        for item in chunk:
            self.progress.read += 1
            duplicate = self._is_duplicate(item.id)
            requests = self._requests(item)
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
                self._render_or_reject(item, pending, todo, rejections)
        return self._budget(todo, rejections), rejections

    def _requests(self, item: Row | BadRow) -> list[Request]:
        """The requests of one row: one per sample, numbered on from the previous row's, so
        the same input and settings always give every request the same slot."""
        n = (item.n if isinstance(item, Row) else None) or self.s.n
        first = self._next_slot
        self._next_slot += n
        return [Request(first + k, k if n > 1 else None, item.line) for k in range(n)]

    def _render_or_reject(self, row: Row, requests: list[Request],
                          todo: list[tuple[Row, str, list[Request]]],
                          rejections: list[dict[str, Any]]) -> None:
        try:
            text = self._render(row)
        except ValueError as exc:
            rejections += [r.mark(_rejected(row, f"bad_messages: {exc}")) for r in requests]
            return
        # No token is longer than MAX_BYTES_PER_TOKEN bytes (and a character is at least one
        # byte), so a text this long cannot fit: reject it without paying to tokenize it.
        if len(text) > MAX_BYTES_PER_TOKEN * self.limits.max_req_input_len:
            reason = (f"prompt_too_long: {len(text)} characters cannot fit in a "
                      f"{self.limits.context_length}-token context")
            rejections += [r.mark(_rejected(row, reason)) for r in requests]
            return
        todo.append((row, text, requests))

    def _budget(self, todo: list[tuple[Row, str, list[Request]]],
                rejections: list[dict[str, Any]]) -> list[TaskPayload]:
        payloads: list[TaskPayload] = []
        ids_batch = self.tokenizer.encode_batch([text for _, text, _ in todo]) if todo else []
        for (row, text, requests), input_ids in zip(todo, ids_batch, strict=True):
            b = budget(len(input_ids), self.limits)
            if b.reason is not None:
                rejections += [r.mark(_rejected(row, b.reason, len(input_ids)))
                               for r in requests]
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
