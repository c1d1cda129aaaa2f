"""SpecForge's rules (tests/support/specforge.py) on the conversations export of the hand-written
output directory, and on rows it must refuse, so the check is known to bite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Export
from tests.support.outdir import read_jsonl
from tests.support.specforge import violations

GOOD: dict[str, Any] = {
    "id": "x", "status": "success", "source": "mix",
    "conversations": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Hi?"},
                      {"role": "assistant", "content": "Hello.", "reasoning_content": "greet"}]}


def test_every_exported_row_passes_specforges_rules(export: Export, drained: Path) -> None:
    assert export(drained, "--format", "conversations").code == 0
    rows = read_jsonl(drained / "export.conversations.jsonl")
    assert len(rows) == 10
    # A raw prompt has no conversation (so no trainer wraps it in a chat turn): the
    # validator's rules are for the conversation lines.
    assert [r["id"] for r in rows if r["conversations"] is None] == ["d", "req-12"]
    rows = [r for r in rows if r["conversations"] is not None]
    for row in rows:
        assert violations(row, strict_think_markers=True) == [], row["id"]
    thinking = [r for r in rows if "reasoning_content" in r["conversations"][-1]]
    assert [r["id"] for r in thinking] == ["b", "i", "i", "i"]
    for row in thinking[1:]:
        assert violations(row, expect_reasoning=True) == []
    # `--expect-reasoning` wants it on every assistant turn: row b's history answer (the
    # input's own, kept as the default `--turns last` keeps history) has none, where
    # SpecForge's own regeneration would have made one: such a set is validated without that
    # flag (or regenerated turn by turn, `--turns all`, which is not built yet).
    assert violations(thinking[0], expect_reasoning=True) == [
        "assistant message 1 has empty reasoning_content"]


def test_inlined_reasoning_fails_the_strict_marker_rule(export: Export, drained: Path) -> None:
    """`--reasoning inline` writes `<think>` into the content: SpecForge's
    `--strict-think-markers` refuses it, so keep (the default) is the SpecForge mode."""
    assert export(drained, "--format", "conversations", "--reasoning", "inline").code == 0
    rows = {r["id"]: r for r in read_jsonl(drained / "export.conversations.jsonl")}
    assert violations(rows["b"]) == []
    assert violations(rows["b"], strict_think_markers=True) == [
        "assistant message 3 content contains a thinking marker"]
    assert violations(rows["i"], expect_reasoning=True) == [
        "assistant message 1 has empty reasoning_content"]


def _with(**changes: Any) -> dict[str, Any]:
    row = {**GOOD, **changes}
    return {k: v for k, v in row.items() if v is not None}


def _turns(*turns: dict[str, Any]) -> dict[str, Any]:
    return _with(conversations=list(turns))


USER = {"role": "user", "content": "Hi?"}
ANSWER = {"role": "assistant", "content": "Hello."}


@pytest.mark.parametrize(("row", "fault"), [
    (_with(conversations=None, messages=GOOD["conversations"]), "no conversations column"),
    (_turns({"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}),
     "message 0 has ShareGPT from/value keys, not role/content"),
    (_with(status=None), "status must be 'success', got None"),
    (_with(id=""), "id must be a non-empty string"),
    (_turns(USER, {"role": "assistant", "content": " "}),
     "message 1 content must be a non-empty string"),
    (_turns(USER, ANSWER, USER), "conversation must end with an assistant message"),
    (_turns(USER, USER, ANSWER), "message 1 expected role 'assistant', got 'user'"),
    (_turns(USER, {"role": "system", "content": "late"}, ANSWER),
     "message 1 has unsupported role 'system'"),
    (_turns(USER, {**ANSWER, "reasoning_content": 3}),
     "assistant message 1 reasoning_content must be a string or null"),
    (_turns({"role": "tool", "content": "42"}, ANSWER), "message 0 has unsupported role 'tool'"),
    (_with(conversations=[]), "conversations must be a non-empty list"),
])
def test_the_rules_refuse_what_specforge_refuses(row: dict[str, Any], fault: str) -> None:
    assert violations(GOOD, expect_reasoning=True, strict_think_markers=True) == []
    assert fault in violations(row)
