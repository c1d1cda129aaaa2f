"""What a trainer's rows say about the answers of a run: for each generated answer, whether the
trainer trains on it with the context the model was sent and the ids it returned, and whether
its loss mask covers exactly those ids; and what else the trainer trains on.

A trainer row is matched to an answer when its input ids are the answer's prompt ids followed
by its output ids, then at most the template's end of turn (`<|im_end|>` and the `\\n` after it
that Qwen's template writes after every message; the model stops at `<|im_end|>`, so the
trainers that render text supervise one token past it: `tail` counts those). Its mask is exact
when it is 0 over the prompt and 1 over the output ids."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.support.trainer_runs import Answer

IM_END = 248046
NEWLINE = 198
TEMPLATE_TAILS = ((), (NEWLINE,), (IM_END, NEWLINE))


@dataclass
class Verdict:
    answers: int = 0  # the answers judged
    trained: Counter[str] = field(default_factory=Counter)  # answer key -> rows matching it
    exact: set[str] = field(default_factory=set)  # keys with a row whose mask is exact
    context_supervised: Counter[str] = field(default_factory=Counter)  # key -> prompt tokens
    tail_supervised: int = 0  # tokens after the answer's ids supervised (its end of turn)
    unmatched: int = 0  # rows that are no answer's prompt + ids (other context, or no answer)
    unmatched_supervised: int = 0  # the tokens those rows supervise
    answer_tokens: int = 0  # the answers' output ids
    trained_tokens: int = 0  # of those, supervised in a matched row

    @property
    def matched(self) -> int:
        return len(self.trained)

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for n in self.trained.values())

    def figures(self) -> dict[str, int]:
        return {"answers": self.answers, "trained_as_sent": self.matched,
                "mask_exact": len(self.exact), "duplicates": self.duplicated,
                "unmatched_rows": self.unmatched,
                "unmatched_supervised_tokens": self.unmatched_supervised,
                "context_tokens_supervised": sum(self.context_supervised.values()),
                "tail_tokens_supervised": self.tail_supervised,
                "answer_tokens": self.answer_tokens, "answer_tokens_trained": self.trained_tokens}


def judge(answers: list[Answer], rows: list[dict[str, Any]]) -> Verdict:
    wanted = {tuple(a.prompt_ids + a.output_ids): a for a in answers}
    verdict = Verdict(answers=len(answers),
                      answer_tokens=sum(len(a.output_ids) for a in answers))
    for row in rows:
        ids, mask = list(row["input_ids"]), list(row["loss_mask"])
        answer = _match(wanted, ids)
        if answer is None:
            verdict.unmatched += 1
            verdict.unmatched_supervised += sum(mask)
            continue
        prompt, output = len(answer.prompt_ids), len(answer.output_ids)
        verdict.trained[answer.key] += 1
        if verdict.trained[answer.key] == 1:
            verdict.trained_tokens += sum(mask[prompt:prompt + output])
        verdict.context_supervised[answer.key] += sum(mask[:prompt])
        verdict.tail_supervised += sum(mask[prompt + output:])
        if mask[:prompt + output] == [0] * prompt + [1] * output:
            verdict.exact.add(answer.key)
    return verdict


def _match(wanted: dict[tuple[int, ...], Answer], ids: list[int]) -> Answer | None:
    for tail in TEMPLATE_TAILS:
        if tail and tuple(ids[-len(tail):]) != tail:
            continue
        answer = wanted.get(tuple(ids[:len(ids) - len(tail)]))
        if answer is not None:
            return answer
    return None
