"""Rows to task payloads, a batch at a time: render, tokenize the batch once, budget; or the
rejections that end a row's requests (and, with `--turns all`, their conversations)."""

from __future__ import annotations

from typing import Any

from fleetgen.queue.contract import TaskPayload
from fleetgen.records.outcomes import rejected_record
from producer.budget import Limits, budget
from producer.request import Request, RequestOptions
from producer.rows import BadRow, Row
from producer.tokenizer import PromptTokenizer

# Longer than any token of the vocabularies we know (Qwen3.6's longest is 128 bytes).
MAX_BYTES_PER_TOKEN = 256


def render_row(tokenizer: PromptTokenizer, row: Row) -> str:
    """The text whose ids are sent for a row: a raw `prompt` as it is, messages through the
    chat template with the row's own `chat_template_kwargs` over the run's. The one rendering
    the producer and `fleetgen export --format tokens` (which re-renders prompts) share."""
    if row.prompt is not None:
        return row.prompt
    assert row.messages is not None
    return tokenizer.render(row.messages, row.template_kwargs)


class Prompts:
    """What every batch shares: the run's tokenizer, its limits and its request options."""

    def __init__(self, tokenizer: PromptTokenizer, limits: Limits,
                 options: RequestOptions) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.options = options

    def batch(self) -> PromptBatch:
        return PromptBatch(self)


class PromptBatch:
    """One batch: rows rendered (or rejected) in the order they are added, then tokenized in
    one call and budgeted by `payloads`. `rejections` holds every rejection, in that order."""

    def __init__(self, prompts: Prompts) -> None:
        self.p = prompts
        self.rejections: list[dict[str, Any]] = []
        self._rendered: list[tuple[Row, str, list[Request]]] = []

    def reject(self, records: list[dict[str, Any]]) -> None:
        self.rejections += records

    def end(self, row: Row, requests: list[Request], reason: str,
            prompt_tokens: int | None = None) -> None:
        self.rejections += ending(row, requests, reason, prompt_tokens)

    def add(self, row: Row, requests: list[Request]) -> None:
        """These requests of the row, sent with its prompt rendered."""
        try:
            text = render_row(self.p.tokenizer, row)
        except ValueError as exc:
            self.end(row, requests, f"bad_messages: {exc}")
            return
        # No token is longer than MAX_BYTES_PER_TOKEN bytes (and a character is at least one
        # byte), so a text this long cannot fit: reject it without paying to tokenize it.
        limits = self.p.limits
        if len(text) > MAX_BYTES_PER_TOKEN * limits.max_req_input_len:
            self.end(row, requests, f"prompt_too_long: {len(text)} characters cannot fit in "
                                    f"a {limits.context_length}-token context")
            return
        self._rendered.append((row, text, requests))

    def payloads(self) -> list[TaskPayload]:
        """The payloads of every request added and not rejected: the prompts tokenized in one
        call, each given what the budget leaves for its answer (or rejected)."""
        payloads: list[TaskPayload] = []
        rendered = self._rendered
        texts = [text for _, text, _ in rendered]
        ids_batch = self.p.tokenizer.encode_batch(texts) if rendered else []
        for (row, text, requests), input_ids in zip(rendered, ids_batch, strict=True):
            b = budget(len(input_ids), self.p.limits)
            if b.reason is not None:
                turn = requests[0].turn or 1
                reason = b.reason if turn == 1 else \
                    f"context_full_at_turn: turn {turn}'s prompt (with the answers before it) " \
                    f"does not fit: {b.reason}"
                self.end(row, requests, reason, len(input_ids))
                continue
            max_tokens = b.max_tokens if row.max_tokens is None else \
                min(b.max_tokens, row.max_tokens)
            for request in requests:
                payloads.append(self.p.options.payload(row, request, input_ids, max_tokens, text))
        self._rendered = []
        return payloads


def ending(row: Row, requests: list[Request], reason: str,
           prompt_tokens: int | None = None) -> list[dict[str, Any]]:
    """Rejections of these requests and, with --turns all, of the later turns of their
    conversations, which end here (every turn of a conversation has its one outcome)."""
    records = []
    for request in requests:
        records.append(request.mark(rejected(row, reason, prompt_tokens)))
        for later in request.later():
            records.append(later.mark(rejected(row, (
                f"conversation_ended: turn {request.turn} was rejected "
                f"({reason.split(':', 1)[0]})"))))
    return records


def rejected(item: Row | BadRow, reason: str,
             prompt_tokens: int | None = None) -> dict[str, Any]:
    return rejected_record(item.id, item.line, reason, prompt_tokens, file=item.source,
                           position=item.position)
