"""`fleetgen export --format conversations`: every result as its conversation plus the answer,
in input order, in the input's own turn style, with reasoning kept, inlined or stripped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from exporter.shape import SHAREGPT_ASSISTANT
from producer.conversation import SHAREGPT_ROLES
from tests.exporter.conftest import Export
from tests.exporter.outdir import MESSAGES_1, SYSTEM, read_jsonl, result


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str, **extra: str) -> dict[str, str]:
    return {"role": "assistant", "content": text, **extra}


def expected(reasoning: str) -> list[dict[str, Any]]:
    """The export of tests/exporter/outdir.py, line by line, written out by hand."""
    def thought(answer: str, why: str) -> dict[str, str]:
        if reasoning == "keep":
            return {"content": answer, "reasoning_content": why}
        if reasoning == "inline":
            return {"content": f"<think>\n{why}\n</think>\n\n{answer}"}
        return {"content": answer}

    b = thought("It is 4.", "2+2 is 4, not 5.")
    sharegpt_b = {"from": "gpt", "value": b.pop("content"), **b}
    return [
        {"id": "a", "messages": [SYSTEM, user("Name a prime."), assistant("7.")],
         "source": "mix-v2", "tags": ["math", "short"], "finish_reason": "stop"},
        {"id": "b", "conversations": [{"from": "human", "value": "What is 2+2?"},
                                      {"from": "gpt", "value": "5"},
                                      {"from": "human", "value": "Check again, 数据 😀."},
                                      sharegpt_b],
         "source": "sharegpt", "finish_reason": "stop"},
        {"id": "c", "conversations": [user("Write a long poem."), assistant("Roses are")],
         "finish_reason": "length"},
        {"id": "d", "messages": [user("The capital of France is"), assistant(" Paris.")],
         "finish_reason": "stop"},
        *[{"id": "i", "messages": [user("Pick a colour."),
                                   {"role": "assistant",
                                    **thought(f"colour {s}", f"thinking {s}")}],
           "sample": s, "finish_reason": "stop"} for s in range(3)],
        {"id": "j", "messages": [user("Pick a number."), assistant("42")], "sample": 0,
         "finish_reason": "stop"},
        {"id": "req-11", "messages": [user("Hi!"), assistant("Hello!")],
         "finish_reason": "stop"},
        {"id": "req-12", "messages": [user("Once upon a time"), assistant(" there was")],
         "finish_reason": "stop"},
        {"id": "n", "messages": [user("Retry me."), assistant("Done.")],
         "finish_reason": "stop"},
    ]


@pytest.mark.parametrize("reasoning", ["keep", "inline", "strip"])
def test_every_result_becomes_its_conversation_with_the_answer(
        reasoning: str, export: Export, drained: Path) -> None:
    ran = export(drained, "--format", "conversations", "--reasoning", reasoning)
    assert ran.code == 0, ran.err
    out = drained / "export.conversations.jsonl"
    assert ran.out.strip() == f"fleetgen export: 11 lines of run 'exp-fixture' -> {out}"
    assert read_jsonl(out) == expected(reasoning)


def test_keep_is_the_default_and_the_id_comes_first(export: Export, drained: Path,
                                                   tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "sft.jsonl"
    assert export(drained, "--format", "conversations", "--out", target).code == 0
    assert read_jsonl(target) == expected("keep")
    first = target.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith('{"id":"a","messages":')
    assert not (drained / "export.conversations.jsonl").exists()
    assert MESSAGES_1[-1]["role"] == "assistant"  # the fixture's trailing answer was dropped


def test_an_answer_cut_off_inside_its_reasoning_keeps_the_block_open(
        export: Export, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".fleetgen-run").write_text("cut\n")
    record = result({"messages": [user("Think hard.")]}, "t", 1, "", finish="length",
                    reasoning="step 1, step 2", reasoning_unfinished=True)
    (out / "results.jsonl").write_bytes(orjson.dumps(record) + b"\n")
    (out / "summary.json").write_bytes(orjson.dumps({"complete": True, "finished_at": 1.0}))
    assert export(out, "--format", "conversations", "--reasoning", "inline").code == 0
    (row,) = read_jsonl(out / "export.conversations.jsonl")
    assert row["messages"][-1] == assistant("<think>\nstep 1, step 2")
    assert export(out, "--format", "conversations").code == 0
    (row,) = read_jsonl(out / "export.conversations.jsonl")
    assert row["messages"][-1] == assistant("", reasoning_content="step 1, step 2")


def test_the_sharegpt_assistant_speakers_are_the_producers() -> None:
    """The exporter drops the trailing answers the producer dropped: same speakers."""
    assert {k for k, v in SHAREGPT_ROLES.items() if v == "assistant"} == SHAREGPT_ASSISTANT
