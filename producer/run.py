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
from producer.enqueue import Enqueuer
from producer.rows import BadRow, Row, read_rows
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer
from workers.records import rejected_record

log = logging.getLogger("fleetgen.producer")

# Settings that change what a row becomes; a resumed run must keep them.
PINNED = ("input", "tokenizer", "context_length", "max_output_tokens", "min_output_tokens",
          "margin", "sampling")
KOMBU_UNACKED = "unacked"


@dataclass
class Progress:
    read: int = 0
    enqueued: int = 0
    rejected: int = 0
    skipped: int = 0  # already done or in flight from an earlier invocation
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
        self._seen_ids: set[int] = set()

    # -- the run ---------------------------------------------------------------------------
    def run(self, on_batch: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> Progress:
        self._open_manifest()
        done = Bits(_raw(self.redis.get(self.keys.done)))
        in_flight = self._lines_in_flight()
        for chunk in _batched(read_rows(self.s.input), self.s.batch_size):
            if should_stop():
                return self.progress
            self.enqueuer.wait_for_room(should_stop)
            payloads, rejections = self._prepare(chunk, done, in_flight)
            self.enqueuer.reject(rejections)
            self.enqueuer.send(payloads)
            self.progress.enqueued += len(payloads)
            self.progress.rejected += len(rejections)
            self.redis.hset(self.keys.manifest, "read", self.progress.read)
            if on_batch:
                on_batch(self.progress)
        self._close_manifest()
        return self.progress

    def _prepare(self, chunk: list[Row | BadRow], done: Bits,
                 in_flight: set[int]) -> tuple[list[TaskPayload], list[dict[str, Any]]]:
        rejections: list[dict[str, Any]] = []
        todo: list[tuple[Row, str]] = []
        for item in chunk:
            self.progress.read += 1
            duplicate = self._is_duplicate(item.id)
            if item.line in done or item.line in in_flight:
                self.progress.skipped += 1
            elif duplicate:
                rejections.append(rejected_record(item.id, item.line, "duplicate_id: an "
                                                  "earlier row has the same id"))
            elif isinstance(item, BadRow):
                rejections.append(rejected_record(item.id, item.line, item.reason))
            else:
                try:
                    todo.append((item, self._render(item)))
                except ValueError as exc:
                    rejections.append(rejected_record(item.id, item.line, f"bad_messages: {exc}"))
        return self._budget(todo, rejections), rejections

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
        """First occurrence wins. 64-bit hashes: ~60 bytes a row, not the ids themselves."""
        h = hash(row_id)
        if h in self._seen_ids:
            return True
        self._seen_ids.add(h)
        return False

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
            "started_at": time.time(), "read": 0,
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
        raw_messages: list[bytes | str] = list(self.redis.lrange(QUEUE, 0, -1))
        for value in self.redis.hvals(KOMBU_UNACKED):
            raw_messages.append(orjson.dumps(orjson.loads(value)[0]))
        for raw in raw_messages:
            payload = _task_payload(raw)
            if payload is not None and payload.get("run") == self.s.run:
                lines.add(int(payload["line"]))
        return lines


def is_complete(client: redis.Redis, run: str) -> bool:
    keys = RunKeys(run)
    manifest = read_hash(client, keys.manifest)
    if manifest.get("state") != STATE_PRODUCED or "total" not in manifest:
        return False
    written = read_hash(client, keys.written)
    count = sum(int(written.get(k, 0)) for k in ("done", "failed", "rejected"))
    return count >= int(manifest["total"]) and client.xlen(keys.stream) == 0


def _check_same_settings(run: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    for name in PINNED:
        if name in old and old.get(name) != new.get(name):
            raise ConfigError(
                f"run {run!r} was started with {name}={old.get(name)!r}, now {new.get(name)!r}; "
                f"resume it with the same settings, or use a new --run name")


def _raw(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _task_payload(raw: bytes | str) -> dict[str, Any] | None:
    """The payload inside a kombu/Celery protocol-2 JSON message, or None if not ours."""
    try:
        message = orjson.loads(raw)
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
