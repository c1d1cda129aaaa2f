"""The producer's pipeline: rows -> render -> tokenize once -> budget -> enqueue or reject."""

from __future__ import annotations

import base64
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis

from fleetgen.contract import (
    QUEUE,
    STATE_PRODUCED,
    STATE_PRODUCING,
    RunKeys,
    TaskPayload,
    runs_index_key,
)
from fleetgen.redisconn import ConfigError, read_hash
from producer.budget import Limits, budget
from producer.dedup import SeenIds
from producer.enqueue import Enqueuer
from producer.rows import BadRow, Row, count_rows, read_rows
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer
from workers.records import rejected_record

log = logging.getLogger("fleetgen.producer")

# Settings that change what a row becomes; a resumed run must keep them.
PINNED = ("input", "tokenizer", "context_length", "max_output_tokens", "min_output_tokens",
          "margin", "sampling")
KOMBU_UNACKED = "unacked"
# Longer than any token of the vocabularies we know (Qwen3.6's longest is 128 bytes).
MAX_BYTES_PER_TOKEN = 256


@dataclass
class Progress:
    read: int = 0
    enqueued: int = 0
    rejected: int = 0
    skipped: int = 0  # already done or in flight from an earlier invocation
    requeued: int = 0  # lost rows enqueued again while waiting (see wait_until_generated)
    started_s: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s


class Bits:
    """A Redis bitmap read once (bit 0 is the most significant bit of byte 0)."""

    def __init__(self, raw: bytes | None) -> None:
        self.raw = raw or b""

    def __contains__(self, line: int) -> bool:
        byte = line >> 3
        return byte < len(self.raw) and bool(self.raw[byte] & (0x80 >> (line & 7)))

    def missing(self, first: int, last: int) -> Iterator[int]:
        """Lines in first..last whose bit is clear; whole bytes of set bits are skipped, so a
        nearly finished 10-million-row run is scanned in a fraction of a second."""
        raw = self.raw.ljust((last >> 3) + 1, b"\0")
        for index in range(first >> 3, (last >> 3) + 1):
            if raw[index] == 0xFF:
                continue
            for bit in range(8):
                line = (index << 3) | bit
                if first <= line <= last and not raw[index] & (0x80 >> bit):
                    yield line


class Producer:
    def __init__(self, settings: ProducerSettings, tokenizer: PromptTokenizer,
                 client: redis.Redis, enqueuer: Enqueuer, limits: Limits) -> None:
        self.s = settings
        self.tokenizer = tokenizer
        self.redis = client
        self.enqueuer = enqueuer
        self.limits = limits
        self.keys = RunKeys(settings.run)
        self.progress = Progress()
        self._seen_ids = SeenIds()  # ~8 bytes a row (bench/memory.py)

    # -- the run ---------------------------------------------------------------------------
    def run(self, on_batch: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> Progress:
        """Enqueue every row that is neither done nor in flight (all of them on a first run;
        what an interrupted run left on a resumed one), then mark the run produced."""
        self._open_manifest()
        done = Bits(_raw(self.redis.get(self.keys.done)))
        in_flight = self._lines_in_flight()
        self._pass(lambda line: line not in done and line not in in_flight, on_batch,
                   should_stop)
        if not should_stop():
            self._close_manifest()
        return self.progress

    def _pass(self, wanted: Callable[[int], bool],
              on_batch: Callable[[Progress], None] | None,
              should_stop: Callable[[], bool]) -> None:
        self.progress = Progress()
        self._seen_ids.clear()
        for chunk in _batched(read_rows(self.s.input), self.s.batch_size):
            if should_stop():
                return
            self.enqueuer.wait_for_room(should_stop)
            payloads, rejections = self._prepare(chunk, wanted)
            self.enqueuer.reject(rejections)
            self.enqueuer.send(payloads)
            self.progress.enqueued += len(payloads)
            self.progress.rejected += len(rejections)
            self.redis.hset(self.keys.manifest, "read", self.progress.read)
            if on_batch:
                on_batch(self.progress)

    # -- reconciliation -------------------------------------------------------------------
    def lost_lines(self) -> set[int]:
        """Lines with no outcome that are neither queued nor held by a worker. After a Redis
        crash (AOF everysec loses up to a second of writes) or a worker killed between
        taking a message and recording it, these would otherwise never finish."""
        total = int(self.manifest().get("total", 0))
        done = Bits(_raw(self.redis.get(self.keys.done)))
        in_flight = self._lines_in_flight()
        return {n for n in done.missing(1, total) if n not in in_flight}

    def wait_until_generated(self, interval_s: float = 30.0,
                             should_stop: Callable[[], bool] = lambda: False,
                             on_tick: Callable[[int, int], None] | None = None) -> int:
        """Wait until every line has an outcome. A line seen lost at two checks in a row (so
        not merely between a worker's BRPOP and its bookkeeping) is enqueued again.
        Returns how many lines were re-enqueued."""
        total = int(self.manifest().get("total", 0))
        suspects: set[int] = set()
        requeued = 0
        next_check = time.monotonic() + interval_s
        while not should_stop():
            generated = int(self.redis.bitcount(self.keys.done))
            if on_tick:
                on_tick(generated, total)
            if generated >= total:
                break
            if time.monotonic() >= next_check:
                lost = self.lost_lines()
                confirmed = lost & suspects
                if confirmed:
                    log.warning("re-enqueueing %d line(s) that were lost (neither queued, in "
                                "flight nor done)", len(confirmed))
                    self._pass(confirmed.__contains__, None, should_stop)
                    requeued += len(confirmed)
                suspects = lost - confirmed
                next_check = time.monotonic() + interval_s
            time.sleep(min(0.5, interval_s))
        return requeued

    def _prepare(self, chunk: list[Row | BadRow],
                 wanted: Callable[[int], bool]) -> tuple[list[TaskPayload], list[dict[str, Any]]]:
        rejections: list[dict[str, Any]] = []
        todo: list[tuple[Row, str]] = []
        for item in chunk:
            self.progress.read += 1
            duplicate = self._is_duplicate(item.id)
            if not wanted(item.line):
                self.progress.skipped += 1
            elif duplicate:
                rejections.append(duplicate_record(item))
            elif isinstance(item, BadRow):
                rejections.append(rejected_record(item.id, item.line, item.reason))
            else:
                self._render_or_reject(item, todo, rejections)
        return self._budget(todo, rejections), rejections

    def _render_or_reject(self, row: Row, todo: list[tuple[Row, str]],
                          rejections: list[dict[str, Any]]) -> None:
        try:
            text = self._render(row)
        except ValueError as exc:
            rejections.append(rejected_record(row.id, row.line, f"bad_messages: {exc}"))
            return
        # No token is longer than MAX_BYTES_PER_TOKEN bytes (and a character is at least one
        # byte), so a text this long cannot fit: reject it without paying to tokenize it.
        if len(text) > MAX_BYTES_PER_TOKEN * self.limits.max_req_input_len:
            rejections.append(rejected_record(row.id, row.line, (
                f"prompt_too_long: {len(text)} characters cannot fit in a "
                f"{self.limits.context_length}-token context")))
            return
        todo.append((row, text))

    def _budget(self, todo: list[tuple[Row, str]],
                rejections: list[dict[str, Any]]) -> list[TaskPayload]:
        payloads: list[TaskPayload] = []
        ids_batch = self.tokenizer.encode_batch([text for _, text in todo]) if todo else []
        for (row, _), input_ids in zip(todo, ids_batch, strict=True):
            b = budget(len(input_ids), self.limits)
            if b.reason is not None:
                rejections.append(rejected_record(row.id, row.line, b.reason, len(input_ids)))
                continue
            payloads.append(TaskPayload(run=self.s.run, line=row.line, id=row.id,
                                        input_ids=input_ids, max_tokens=b.max_tokens,
                                        sampling=self.s.sampling, row=row.fields))
        return payloads

    def _render(self, row: Row) -> str:
        if row.prompt is not None:
            return row.prompt
        assert row.messages is not None
        return self.tokenizer.render(row.messages)

    def _is_duplicate(self, row_id: str) -> bool:
        """First occurrence wins. 64-bit hashes, not the ids themselves."""
        return not self._seen_ids.add(hash(row_id))

    # -- manifest and resume ----------------------------------------------------------------
    def manifest(self) -> dict[str, str]:
        return read_hash(self.redis, self.keys.manifest)

    def _open_manifest(self) -> None:
        settings = self.s.manifest_settings()
        settings["context_length"] = self.limits.context_length
        old = self.manifest()
        if old:
            _check_same_settings(self.s.run, orjson.loads(old.get("settings", "{}")), settings)
            self.redis.hset(self.keys.manifest, "state", STATE_PRODUCING)
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.keys.manifest, mapping={
            "settings": orjson.dumps(settings), "state": STATE_PRODUCING,
            "started_at": time.time(), "read": 0, "expected": count_rows(self.s.input),
        })
        pipe.sadd(runs_index_key(), self.s.run)
        pipe.execute()

    def _close_manifest(self) -> None:
        self.redis.hset(self.keys.manifest, mapping={
            "state": STATE_PRODUCED, "total": self.progress.read, "produced_at": time.time(),
        })

    def _lines_in_flight(self) -> set[int]:
        """Lines of this run now in the queue or held unacked by a worker: a resumed producer
        must not enqueue them again. Both are bounded by the high-water mark and the fleet's
        concurrency, so this scan is small whatever the run's size."""
        lines: set[int] = set()
        messages = [orjson.loads(raw) for raw in self.redis.lrange(QUEUE, 0, -1)]
        # kombu keeps an unacked message as [message, exchange, routing_key].
        messages += [orjson.loads(raw)[0] for raw in self.redis.hvals(KOMBU_UNACKED)]
        for message in messages:
            payload = _task_payload(message)
            if payload is not None and payload.get("run") == self.s.run:
                lines.add(int(payload["line"]))
        return lines


def duplicate_record(item: Row | BadRow) -> dict[str, Any]:
    """A later row reusing an id is rejected under `<id>#<line>`, so no id is ever written
    twice; `duplicate_of` names the id it repeats."""
    record = rejected_record(f"{item.id}#{item.line}", item.line,
                             "duplicate_id: an earlier row has the same id")
    record["duplicate_of"] = item.id
    return record


def _check_same_settings(run: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    for name in PINNED:
        if name in old and old.get(name) != new.get(name):
            raise ConfigError(
                f"run {run!r} was started with {name}={old.get(name)!r}, now {new.get(name)!r}; "
                f"resume it with the same settings, or use a new --run name")


def _raw(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _task_payload(message: Any) -> dict[str, Any] | None:
    """The payload inside a kombu/Celery protocol-2 message, or None if not ours."""
    try:
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = orjson.loads(body)[0]
        payload = args[0]
        return payload if isinstance(payload, dict) else None
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _batched(items: Iterable[Row | BadRow], size: int) -> Iterator[list[Row | BadRow]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def resolve_limits(s: ProducerSettings) -> Limits:
    """The context from --context-length, else from the engine; KV capacity from the engine."""
    from workers.engine import read_limits
    from workers.errors import EngineError

    max_total = None
    context = s.context_length
    if s.engine_url:
        try:
            server = read_limits(s.engine_url, api_key=s.engine_api_key)
        except EngineError as exc:
            raise ConfigError(f"cannot read limits from {s.engine_url}: {exc.message}") from exc
        if context is not None and context > server.context_length:
            raise ConfigError(f"--context-length {context} exceeds the server's "
                              f"{server.context_length}")
        context = context or server.context_length
        max_total = server.max_total_tokens
    assert context is not None
    try:
        return Limits(context_length=context, max_total_tokens=max_total,
                      cap=s.max_output_tokens, margin=s.margin,
                      min_output_tokens=s.min_output_tokens)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
