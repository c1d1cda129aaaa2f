"""Answers beyond plain words: a thinking model's reasoning, JSON documents, log-probabilities.

All of it is a pure function of the request key, the prompt, the budget and the request's
options, so tests recompute every answer (tests/support/content.py).

A thinking model (`--thinking`, Qwen3's tokens) writes `<think>` (248068), `\\n` (198), its
reasoning, `\\n`, `</think>` (248069), `\\n\\n` (271), then its answer; it skips the reasoning when
the prompt ends with the empty block `<think>\\n\\n</think>\\n\\n` (Qwen's template with
`enable_thinking=false`), and starts inside it, without a `<think>` of its own, when the prompt
already opened one. The reasoning and the answer have lengths of the same distribution; a budget
that ends inside the reasoning finishes `length` with no `</think>`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetgen.simulator import schema as schemas
from fleetgen.simulator.model import (
    SPECIAL_IDS,
    STOP_TOKEN_ID,
    VOCAB_SIZE,
    WORD_IDS,
    WORDS,
    Completion,
    generate,
    joined,
    natural_length,
)

THINK_START_ID = 248068
THINK_END_ID = 248069
NEWLINE_ID = 198
PARAGRAPH_ID = 271  # "\n\n"
THINK_START = "<think>"
THINK_END = "</think>"
EMPTY_THINK_IDS = (THINK_START_ID, PARAGRAPH_ID, THINK_END_ID, PARAGRAPH_ID)
EMPTY_THINK_TEXT = "<think>\n\n</think>\n\n"
# Salts so the document, the logprobs and the invalid-document draw are streams of their own.
_DOCUMENT_SALT = 0x5EED_D0C
_LOGPROB_SALT = 0x10_6920B
_BROKEN_SALT = 0xB0_4E4


class Opening(enum.Enum):
    ANSWER = "answer"  # no reasoning: thinking is off for this prompt
    OPENS = "opens"  # the model opens the block itself
    INSIDE = "inside"  # the prompt opened it: the answer starts in reasoning


def opening(prompt: Sequence[int] | str) -> Opening:
    """Where a thinking model starts, from the end of its prompt."""
    if isinstance(prompt, str):
        if prompt.endswith(EMPTY_THINK_TEXT):
            return Opening.ANSWER
        start = prompt.rfind(THINK_START)
        return Opening.INSIDE if start >= 0 and THINK_END not in prompt[start:] \
            else Opening.OPENS
    if tuple(prompt[-len(EMPTY_THINK_IDS):]) == EMPTY_THINK_IDS:
        return Opening.ANSWER
    for token in reversed(prompt):
        if token == THINK_END_ID:
            return Opening.OPENS
        if token == THINK_START_ID:
            return Opening.INSIDE
    return Opening.OPENS


@dataclass(frozen=True)
class Style:
    """What shapes an answer beyond its key and budget."""

    thinking: bool = False  # the server models a thinking model
    schema: Any = None  # a checked JSON schema: the answer is a document for it
    # The grammar waits for `</think>`: SGLang's `require_reasoning` on a server with a
    # reasoning parser, vLLM's parser on a prompt whose reasoning has not ended.
    reasoning_first: bool = False
    skip_special_tokens: bool = True
    broken_json: bool = False  # this request's document comes out invalid (--json-invalid-rate)
    stop: tuple[str, ...] = ()  # stop strings, in the request's order
    # Stop strings are matched on the text with special tokens (SGLang decodes its tail with
    # them, whatever skip_special_tokens says); vLLM matches the text it returns.
    stop_sees_special: bool = True
    stop_trim: bool = True  # SGLang `no_stop_trim: true` keeps the matched string in the text


PLAIN = Style()


def breaks_json(key: int, rate: float) -> bool:
    """Whether the request with this key gets an invalid document (a fault of its own)."""
    return rate > 0 and random.Random(key ^ _BROKEN_SALT).random() < rate


def reasons(prompt: Sequence[int] | str, style: Style) -> bool:
    """Whether the answer begins with reasoning. A grammar that does not wait for `</think>`
    constrains the answer from its first token, so there is none."""
    return style.thinking and opening(prompt) is not Opening.ANSWER and (
        style.schema is None or style.reasoning_first)


def grammar(prompt: Sequence[int] | str, style: Style) -> Any:
    """The schema that shapes the answer, or None. A grammar told to wait for `</think>` on a
    prompt that closed the think block never applies: the answer comes without reasoning, so
    the `</think>` it waits for never comes (`ReasonerGrammarObject.maybe_init_reasoning(True)`
    leaves the mask off until it has seen the think-end tokens), and the answer is free text."""
    if style.schema is not None and style.reasoning_first and style.thinking \
            and opening(prompt) is Opening.ANSWER:
        return None
    return style.schema


def compose(key: int, mean_tokens: int, max_new_tokens: int, prompt: Sequence[int] | str,
            style: Style = PLAIN, min_new_tokens: int = 0, ignore_eos: bool = False,
            ) -> Completion:
    """The deterministic answer for `key` under this style, cut at `max_new_tokens`; a
    smaller budget gives a prefix of the same answer. A plain answer is `model.generate`'s.
    A document ends where it ends: `min_new_tokens` and `ignore_eos` do not stretch it."""
    answer = _compose(key, mean_tokens, max_new_tokens, prompt, style, min_new_tokens,
                      ignore_eos)
    if not style.stop:
        return answer
    return stop_at(answer, style.stop, style.stop_sees_special, style.stop_trim)


def _compose(key: int, mean_tokens: int, max_new_tokens: int, prompt: Sequence[int] | str,
             style: Style, min_new_tokens: int, ignore_eos: bool) -> Completion:
    thinks = reasons(prompt, style)
    schema = grammar(prompt, style)
    if not thinks and schema is None:
        return generate(key, mean_tokens, max_new_tokens, min_new_tokens, ignore_eos)
    rng = random.Random(key)
    answer_len = natural_length(rng, mean_tokens)
    head: list[tuple[str, int]] = []
    tail: list[tuple[str, int]] = []
    reasoning_len = 0
    if thinks:
        reasoning_len = natural_length(rng, mean_tokens)
        if opening(prompt) is Opening.OPENS:
            head = [(THINK_START, THINK_START_ID), ("\n", NEWLINE_ID)]
        tail = [("\n", NEWLINE_ID), (THINK_END, THINK_END_ID), ("\n\n", PARAGRAPH_ID)]
    document = None if schema is None else document_tokens(key, style)
    before = len(head) + reasoning_len + len(tail)
    total = before + (len(document) if document is not None else answer_len)
    if document is None:
        total = max(max_new_tokens + 1 if ignore_eos else total, min_new_tokens)
    produced = min(total, max_new_tokens)
    tokens = head[:produced]
    tokens += _words(rng, min(reasoning_len, max(0, produced - len(head))))
    tokens += tail[:max(0, produced - len(head) - reasoning_len)]
    rest = produced - before
    if rest > 0:
        tokens += document[:rest] if document is not None else _words(rng, rest)
    finish: dict[str, Any] = ({"type": "stop", "matched": STOP_TOKEN_ID} if produced == total
                              else {"type": "length", "length": max_new_tokens})
    return joined([text for text, _ in tokens], [token for _, token in tokens], finish,
                  style.skip_special_tokens)


def stop_at(answer: Completion, stops: Sequence[str], with_special: bool,
            trim: bool = True) -> Completion:
    """The answer ended by its first stop string, as SGLang 0.5.23 ends it.

    `Req._check_str_based_finish` (schedule_batch.py), after every token and before the length
    and stop-token checks: the first stop string, in the request's order, found in the text
    so far finishes the request with `FINISH_MATCHED_STR` (`{"type": "stop", "matched":
    <the string>}`), its output ids running to the token that completed the match
    (`_locate_str_stop_finished_len`). The detokenizer then cuts the text before the string's
    first occurrence (`DetokenizerManager.trim_matched_stop`, `output[:pos]`, or after it,
    `output[:end]`, with `no_stop_trim`; left whole when the text, without its special tokens,
    does not hold it). vLLM (`StopChecker.
    check_stop_strings`) matches the text it returns and cuts it the same way."""
    pieces = answer.pieces if answer.pieces is not None else tuple(answer.token_texts())
    ids = answer.output_ids
    seen = ""
    longest = max(len(stop) for stop in stops)
    for index, (piece, token) in enumerate(zip(pieces, ids, strict=True)):
        if with_special or not (answer.skip_special_tokens and token in SPECIAL_IDS):
            seen += piece
        # A match not there before this token ends inside it.
        tail = seen[max(0, len(seen) - len(piece) - longest):]
        matched = next((stop for stop in stops if stop in tail), None)
        if matched is not None:
            cut = joined(pieces[:index + 1], ids[:index + 1],
                         {"type": "stop", "matched": matched}, answer.skip_special_tokens)
            at = cut.text.find(matched)
            text = cut.text if at < 0 else cut.text[:at + (len(matched) if not trim else 0)]
            return dataclasses.replace(cut, text=text)
    return answer


def _words(rng: random.Random, count: int) -> list[tuple[str, int]]:
    indices = rng.choices(range(len(WORDS)), k=count)
    return [(WORDS[i] if n == 0 else f" {WORDS[i]}", WORD_IDS[i])
            for n, i in enumerate(indices)]


def document_tokens(key: int, style: Style) -> list[tuple[str, int]]:
    """The JSON document of this request, as tokens; an invalid one (`broken_json`) lacks
    its last token."""
    doc = schemas.document(style.schema, random.Random(key ^ _DOCUMENT_SALT))
    pieces = schemas.pieces(schemas.dumps(doc))
    if style.broken_json:
        pieces = pieces[:-1]
    return [(piece, piece_id(piece)) for piece in pieces]


def piece_id(piece: str) -> int:
    """A stable id in the ordinary vocabulary for a token of a document."""
    digest = hashlib.blake2b(piece.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "big") % VOCAB_SIZE


def reasoning_tokens(output_ids: Sequence[int], parser: bool, required: bool) -> int:
    """meta_info `reasoning_tokens` of a server with a reasoning parser (`--thinking` models
    one, `--reasoning-parser qwen3`, unless `--no-reasoning-parser`),
    `BatchResultProcessor._maybe_update_reasoning_tokens`: with `require_reasoning` every token
    up to and including `</think>` counts (`Req.update_reasoning_tokens`); without, only
    reasoning the output opens itself with `<think>` (`Req.update_self_opened_reasoning_tokens`).
    0 without a parser (`ModelConfig.think_end_ids` stays None)."""
    if not parser or not output_ids:
        return 0
    if not required and output_ids[0] != THINK_START_ID:
        return 0
    for index, token in enumerate(output_ids):
        if token == THINK_END_ID:
            return index + 1
    return len(output_ids)


# ---------------------------------------------------------------- log-probabilities

# Ids of the runners-up: fixed strides from the chosen token, distinct for K <= 64.
_RUNNER_UP_STRIDE = 104729


def token_logprobs(key: int, output_ids: Sequence[int], top: int,
                   ) -> list[tuple[float, list[tuple[float, int]]]]:
    """Per output token: its logprob, and the `top` most likely tokens as (logprob, id),
    best first. The chosen token is the most likely (greedy), the runners-up fall off
    geometrically. Each position has a stream of its own, so K changes no other value."""
    out: list[tuple[float, list[tuple[float, int]]]] = []
    for position, token in enumerate(output_ids):
        rng = random.Random((key ^ _LOGPROB_SALT) * 1_000_003 + position)
        chosen = -rng.expovariate(6.0)
        ranked = [(chosen, token)]
        value = chosen
        for rank in range(1, top):
            value -= rng.expovariate(0.8)
            ranked.append((value, (token + rank * _RUNNER_UP_STRIDE) % VOCAB_SIZE))
        out.append((chosen, ranked[:top]))
    return out
