"""What one request asks for (pure): which sample of its row it is, and its options — the run's
flags as defaults, the row's own options over them, a seed per sample, the reasoning split."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from fleetgen.errors import ConfigError
from fleetgen.queue.contract import Sampling, TaskPayload
from fleetgen.records.outcomes import request_fields
from producer.budget import Limits
from producer.rows import Row
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer

log = logging.getLogger("fleetgen.producer")

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# What the run's template does with a plain question: whether its prompts open the think block.
PROBE_CHAT = [{"role": "user", "content": "?"}]


@dataclass(frozen=True)
class Request:
    """One request of a row: its slot in the run's bitmaps and, when the row is sampled several
    times, its sample index (None for a row's only request)."""

    slot: int
    sample: int | None
    line: int
    # `--turns all`: the assistant turn this request generates (1-based) of `turns`.
    turn: int | None = None
    turns: int | None = None

    def mark(self, record: dict[str, Any]) -> dict[str, Any]:
        """An outcome record of this request: `sample` when there are several, and `slot`
        where it is not the line (the drainer and the bitmaps key on it)."""
        record.update(self.fields())
        return record

    def fields(self) -> dict[str, Any]:
        return request_fields(line=self.line, slot=self.slot, sample=self.sample,
                              turn=self.turn, turns=self.turns)

    def later(self) -> list[Request]:
        """The turns of this request's conversation after it (none outside `--turns all`)."""
        if self.turn is None or self.turns is None:
            return []
        return [Request(self.slot + k, self.sample, self.line, self.turn + k, self.turns)
                for k in range(1, self.turns - self.turn + 1)]


class RequestOptions:
    """Builds the task payload of a request from the run's settings and the row."""

    def __init__(self, settings: ProducerSettings, tokenizer: PromptTokenizer,
                 limits: Limits | None = None) -> None:
        self.s = settings
        self.split_reasoning = _wants_split(settings.reasoning, tokenizer)
        self.cannot_wait = None if limits is None else limits.grammar_cannot_wait
        if settings.n > 1 and is_greedy(settings.sampling):
            log.warning("--n %d with greedy sampling (temperature 0): every sample of a row "
                        "will be the same answer; pass --temperature > 0", settings.n)

    def payload(self, row: Row, request: Request, input_ids: list[int], max_tokens: int,
                text: str) -> TaskPayload:
        payload = TaskPayload(run=self.s.run, line=row.line, id=row.id, input_ids=input_ids,
                              max_tokens=max_tokens, sampling=self.sampling(row, request),
                              row=row.fields)
        payload.update(request.fields())  # type: ignore[typeddict-item]
        if row.source is not None and row.position is not None:
            payload["file"], payload["position"] = row.source, row.position
        if self.split_reasoning:
            payload["think"] = True
            if opens_reasoning(text):
                payload["think_open"] = True
        if self.s.logprobs:
            payload["logprobs"] = self.s.logprobs
        if self.s.token_ids:
            payload["token_ids"] = True
        schema = row.json_schema or self.s.json_schema
        if schema is not None:
            if self.cannot_wait is not None and payload.get("think_open"):
                what = "--json-schema" if row.json_schema is None else \
                    f"row {row.line}'s json_schema"
                raise ConfigError(unwaitable_schema(what, self.cannot_wait))
            payload["json_schema"] = schema
        return payload

    def sampling(self, row: Row, request: Request) -> Sampling:
        merged: dict[str, Any] = {**self.s.sampling, **row.sampling}
        if request.sample is not None:
            merged["seed"] = sample_seed(row.id, request.sample, merged.get("seed"))
        return Sampling(**merged)  # type: ignore[typeddict-item]


def sample_seed(row_id: str, sample: int, base: int | None) -> int:
    """A seed of its own for every sample, derived from the row's id, the sample index and the
    run's (or row's) seed, so samples differ from each other and a rerun repeats them."""
    digest = hashlib.blake2b(f"{base}\0{row_id}\0{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF  # engines take a signed 32-bit seed


def unwaitable_schema(what: str, why: str) -> str:
    """The one-line refusal of a schema on a thinking prompt that the servers cannot honour."""
    return (f"{what} on a thinking prompt (the chat template leaves <think> open) needs a "
            f"grammar that waits for </think>: {why}; or switch thinking off with "
            """--chat-template-kwargs '{"enable_thinking": false}'""")


def is_greedy(sampling: Sampling) -> bool:
    return sampling.get("temperature") == 0 or sampling.get("top_k") == 1


def opens_reasoning(prompt: str) -> bool:
    """The rendered prompt ends inside an open <think> block (a template that starts the
    reasoning itself), so the answer begins in reasoning."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


def _wants_split(mode: str, tokenizer: PromptTokenizer) -> bool:
    """`auto` splits when </think> is one token of the model's vocabulary (a thinking model:
    Qwen3.x, DeepSeek-R1, ...): the engine is then asked to keep it in the text."""
    if mode != "auto":
        return mode == "split"
    return len(tokenizer.encode_batch([THINK_CLOSE])[0]) == 1
