"""The reasoning split (pure): a thinking model's answer cut at `</think>` into its reasoning and
its completion, with the reasoning counted in tokens.

Qwen3-style models write `<think>` (id 248068), their reasoning, `</think>` (id 248069), then
the answer; both tags are special tokens, so the engine must be asked to keep them in the text
(SGLang and vLLM drop special tokens from `text` by default: `skip_special_tokens`). The count
follows SGLang's own (`schedule_batch.py` `Req.update_reasoning_tokens` and
`update_self_opened_reasoning_tokens`): every output token up to and including `</think>`, the
opening `<think>` too, or every token when `</think>` never came.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"
THINK_START_ID = 248068  # Qwen3 / Qwen3.5 / Qwen3.6 vocabularies
THINK_END_ID = 248069


@dataclass(frozen=True)
class Split:
    """One answer, split. `reasoning` is None when the answer has none (the model did not think,
    or the prompt switched thinking off); `reasoning_tokens` is None when the engine sent no
    output ids to count (the split itself still holds)."""

    reasoning: str | None
    completion: str
    reasoning_tokens: int | None
    unfinished: bool  # it was reasoning when it stopped: no `</think>`, no answer at all


def split_reasoning(text: str, output_ids: Sequence[int] | None = None, *,
                    think_open: bool = False, stopped: bool = False) -> Split:
    """Split `text` (special tokens kept) at its first `</think>`.

    The answer is in reasoning from its first token when the prompt opened the block itself
    (`think_open`), or when it opens with `<think>` (in the text, or as its first id). Without
    `</think>`, an answer in reasoning is all reasoning and unfinished; any other answer is all
    completion. Whitespace between the tags and the parts is not part of either.

    Ids that hold `</think>` with a text that does not (an engine that dropped special tokens
    although asked to keep them) cannot be cut: the whole text is the completion, reasoning
    None, and the count still comes from the ids. Not so when a stop string ended the answer
    (`stopped`): the text was cut before the string and the ids run through it, so a
    `</think>` in the ids past the cut says nothing of the text; the text alone is split (a
    stop hit inside the reasoning leaves it unfinished).
    """
    head, tag, tail = text.partition(THINK_END)
    opened = think_open or text.lstrip().startswith(THINK_START) or bool(
        output_ids and output_ids[0] == THINK_START_ID)
    if not tag and not stopped and output_ids is not None and THINK_END_ID in output_ids:
        return Split(None, text, count_reasoning(output_ids, opened), False)
    if tag:
        reasoning: str | None = _strip_open(head)
        completion = tail.lstrip()
    elif opened:
        reasoning, completion = _strip_open(text), ""
    else:
        reasoning, completion = None, text
    unfinished = opened and not tag
    return Split(reasoning, completion, count_reasoning(output_ids, opened), unfinished)


def count_reasoning(output_ids: Sequence[int] | None, opened: bool) -> int | None:
    """Tokens up to and including `</think>` (all of them when it never came), 0 for an answer
    that never reasoned, None without ids."""
    if output_ids is None:
        return None
    for index, token in enumerate(output_ids):
        if token == THINK_END_ID:
            return index + 1
    return len(output_ids) if opened else 0


def _strip_open(head: str) -> str:
    head = head.strip()
    if head.startswith(THINK_START):
        head = head[len(THINK_START):]
    return head.strip()
