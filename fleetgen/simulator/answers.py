"""Answers beyond plain words: a thinking model's reasoning, JSON documents, log-probabilities.

All of it is a pure function of the request key, the prompt, the budget and the request's
options, so tests recompute every answer (tests/support/content.py).

Every token is a Qwen3.6 token and the ids decode to the text (fleetgen/simulator/vocab.py); a
natural stop ends the ids with `<|im_end|>` (248046), which the text leaves out.

A thinking model (`--thinking`, Qwen3.6's tokens) writes `<think>` (248068), `\\n` (198), its
reasoning, `\\n`, `</think>` (248069), `\\n\\n` (271), then its answer; it skips the reasoning when
the prompt ends with the empty block `<think>\\n\\n</think>\\n\\n` (Qwen's template with
`enable_thinking=false`), and starts inside it, without a `<think>` of its own, when the prompt
already opened one. The reasoning and the answer have lengths of the same distribution; a budget
that ends inside the reasoning finishes `length` with no `</think>`.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetgen.simulator import pattern as patterns
from fleetgen.simulator import schema as schemas
from fleetgen.simulator import vocab
from fleetgen.simulator.model import (
    SPECIAL_IDS,
    STOP_TOKEN_ID,
    WORDS,
    Completion,
    generate,
    joined,
    natural_length,
)
from fleetgen.simulator.vocab import (
    NEWLINE_ID,
    PARAGRAPH_ID,
    THINK_END,
    THINK_END_ID,
    THINK_START,
    THINK_START_ID,
)

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
    regex: str | None = None  # a checked regex (SGLang `regex`): the answer matches it
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
    # What holds a plain answer's end-of-turn back: none before `min_new_tokens`, none at all
    # with `ignore_eos` (the request's sampling params).
    min_new_tokens: int = 0
    ignore_eos: bool = False


PLAIN = Style()


def breaks_json(key: int, rate: float) -> bool:
    """Whether the request with this key gets an invalid document (a fault of its own)."""
    return rate > 0 and random.Random(key ^ _BROKEN_SALT).random() < rate


def reasons(prompt: Sequence[int] | str, style: Style) -> bool:
    """Whether the answer begins with reasoning. A grammar that does not wait for `</think>`
    constrains the answer from its first token, so there is none."""
    return style.thinking and opening(prompt) is not Opening.ANSWER and (
        not constrained(style) or style.reasoning_first)


def constrained(style: Style) -> bool:
    return style.schema is not None or style.regex is not None


def grammar(prompt: Sequence[int] | str, style: Style) -> Any:
    """The schema that shapes the answer, or None. A grammar told to wait for `</think>` on a
    prompt that closed the think block never applies: the answer comes without reasoning, so
    the `</think>` it waits for never comes (`ReasonerGrammarObject.maybe_init_reasoning(True)`
    leaves the mask off until it has seen the think-end tokens), and the answer is free text."""
    if constrained(style) and style.reasoning_first and style.thinking \
            and opening(prompt) is Opening.ANSWER:
        return None
    return style.schema if style.schema is not None else style.regex


def compose(key: int, mean_tokens: int, max_new_tokens: int, prompt: Sequence[int] | str,
            style: Style = PLAIN) -> Completion:
    """The deterministic answer for `key` under this style, cut at `max_new_tokens`; a
    smaller budget gives a prefix of the same answer. A plain answer is `model.generate`'s.
    A document ends where it ends: the style's `min_new_tokens` and `ignore_eos` do not
    stretch it."""
    answer = _compose(key, mean_tokens, max_new_tokens, prompt, style)
    if not style.stop:
        return answer
    return stop_at(answer, style.stop, style.stop_sees_special, style.stop_trim)


def _compose(key: int, mean_tokens: int, max_new_tokens: int, prompt: Sequence[int] | str,
             style: Style) -> Completion:
    min_new_tokens, ignore_eos = style.min_new_tokens, style.ignore_eos
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
    document = None if schema is None else \
        document_tokens(key, style) if style.schema is not None else pattern_tokens(key, style)
    before = len(head) + reasoning_len + len(tail)
    # The answer's own tokens; the end-of-turn token follows them (model.generate). A document
    # ends where its grammar does, and the grammar then allows only the EOS, whatever
    # `ignore_eos` says (`update_finish_state`: `grammar.is_terminated()`).
    content = before + (len(document) if document is not None else answer_len)
    eos = document is not None or not ignore_eos
    if document is None:
        content = max(max_new_tokens + 1 if ignore_eos else content, min_new_tokens)
    total = content + 1 if eos else content
    produced = min(total, max_new_tokens)
    tokens = head[:produced]
    tokens += _words(rng, min(reasoning_len, max(0, produced - len(head))))
    tokens += tail[:max(0, produced - len(head) - reasoning_len)]
    rest = min(produced, content) - before
    if rest > 0:
        tokens += document[:rest] if document is not None else _words(rng, rest)
    finish: dict[str, Any] = {"type": "length", "length": max_new_tokens}
    if produced == total:
        tokens.append((vocab.EOS_TEXT, STOP_TOKEN_ID))
        finish = {"type": "stop", "matched": STOP_TOKEN_ID}
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
        # vLLM never detokenizes the stop token; SGLang's tail decode holds it.
        if with_special or not (token == STOP_TOKEN_ID
                                or (answer.skip_special_tokens and token in SPECIAL_IDS)):
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
    return [(WORDS[i], vocab.FIRST_IDS[i]) if n == 0 else (f" {WORDS[i]}", vocab.SPACED_IDS[i])
            for n, i in enumerate(indices)]


def document_tokens(key: int, style: Style) -> list[tuple[str, int]]:
    """The JSON document of this request, as Qwen3.6 tokens of its text (the vocabulary's own
    encoding); an invalid one (`broken_json`) lacks its last token."""
    doc = schemas.document(style.schema, random.Random(key ^ _DOCUMENT_SALT))
    ids = vocab.encode(schemas.dumps(doc))
    if style.broken_json:
        ids = ids[:-1]
    return list(zip(vocab.token_pieces(ids), ids, strict=True))


def pattern_tokens(key: int, style: Style) -> list[tuple[str, int]]:
    """The text of this request matching its regex, as Qwen3.6 tokens."""
    assert style.regex is not None
    ids = vocab.encode(patterns.text(style.regex, random.Random(key ^ _DOCUMENT_SALT)))
    return list(zip(vocab.token_pieces(ids), ids, strict=True))


def reasoning_tokens(output_ids: Sequence[int], parser: bool, required: bool) -> int:
    """meta_info `reasoning_tokens` of SGLang 0.5.23 with a reasoning parser (`--thinking`
    models `--reasoning-parser qwen3`, unless `--no-reasoning-parser`):
    `BatchResultProcessor._maybe_update_reasoning_tokens` counts only with `require_reasoning`
    (`Req.update_reasoning_tokens`: every token up to and including `</think>`, all of them
    while it has not come). Without it, only a parser that names a self-opened start tag
    counts (`self_opened_think_start_ids`, from `get_self_opened_think_start_token_ids`, None
    for `qwen3`): 0. 0 without a parser (`ModelConfig.think_end_ids` stays None)."""
    if not parser or not required or not output_ids:
        return 0
    for index, token in enumerate(output_ids):
        if token == THINK_END_ID:
            return index + 1
    return len(output_ids)


# ---------------------------------------------------------------- log-probabilities

# The runners-up are other words of the table (real tokens whose text is known without the
# vocabulary), distinct for K <= 128.
_RUNNERS_UP = vocab.TABLE_IDS


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
        others = (t for t in _cycle_from(token) if t != token)
        for _ in range(1, top):
            value -= rng.expovariate(0.8)
            ranked.append((value, next(others)))
        out.append((chosen, ranked[:top]))
    return out


def _cycle_from(token: int) -> Sequence[int]:
    start = token % len(_RUNNERS_UP)
    return _RUNNERS_UP[start:] + _RUNNERS_UP[:start]
