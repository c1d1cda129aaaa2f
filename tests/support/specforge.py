"""SpecForge's rules for a training row, as read from its sources (SpecForge a6b6b02), applied
to a `fleetgen export --format conversations` line: a list of what SpecForge would refuse or
misread, empty when it takes the row as it is. The rules are restated here, not imported:
SpecForge is not a dependency, and its trainer needs torch and a GPU.

Where each rule comes from:
- `specforge/data/preprocessing.py` `build_eagle3_dataset`: the dataset needs a
  `conversations` column ("Expected 'conversations' column for is_preformatted=False").
- `scripts/validate_regenerated_data.py` `validate_row`: `id` a non-empty string, `status`
  "success", an assistant turn at the end, `reasoning_content` a string or null; with
  `--expect-reasoning`, non-empty on every assistant turn; with `--strict-think-markers`, no
  `<think>` or `</think>` in an assistant's content or reasoning.
- `scripts/conversation_validation.py` `validate_conversation`: a non-empty list of objects,
  each with non-empty string content; `system` only before the first user turn; otherwise only
  `user` and `assistant`, alternating from `user`.
- `specforge/data/parse.py` `Parser._normalize_message` reads `role` (else `from`) and
  `content` (else `value`), and `ThinkingParser.standard_keys` passes `reasoning_content` on
  to the chat template: the reasoning has to be under that key of the assistant turn, and a
  turn that still says `from`/`value` would only be read through the fallback, so it counts
  as a fault here (fleetgen writes role/content).
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant")
THINK_MARKERS = ("<think>", "</think>")


def violations(row: Any, *, expect_reasoning: bool = False,
               strict_think_markers: bool = False) -> list[str]:
    """What SpecForge's loader and validator would refuse in this row."""
    if not isinstance(row, dict):
        return ["the row is not an object"]
    found: list[str] = []
    if not isinstance(row.get("id"), str) or not row["id"].strip():
        found.append("id must be a non-empty string")
    if row.get("status") != "success":
        found.append(f"status must be 'success', got {row.get('status')!r}")
    turns = row.get("conversations")
    if "conversations" not in row:
        found.append("no conversations column")
    if not isinstance(turns, list) or not turns:
        return [*found, "conversations must be a non-empty list"]
    found += _order(turns)
    for index, turn in enumerate(turns):
        if isinstance(turn, dict) and turn.get("role") == "assistant":
            found += _assistant(index, turn, expect_reasoning, strict_think_markers)
    if not isinstance(turns[-1], dict) or turns[-1].get("role") != "assistant":
        found.append("conversation must end with an assistant message")
    return found


def _order(turns: list[Any]) -> list[str]:
    found: list[str] = []
    expected, saw_user = "user", False
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            found.append(f"message {index} must be an object")
            continue
        if "from" in turn or "value" in turn:
            found.append(f"message {index} has ShareGPT from/value keys, not role/content")
        role, content = turn.get("role"), turn.get("content")
        if not isinstance(content, str) or not content.strip():
            found.append(f"message {index} content must be a non-empty string")
        if role == "system" and not saw_user:
            continue
        if role not in ROLES[1:]:
            found.append(f"message {index} has unsupported role {role!r}")
        elif role != expected:
            found.append(f"message {index} expected role {expected!r}, got {role!r}")
        saw_user = True
        expected = "assistant" if role == "user" else "user"
    if not saw_user:
        found.append("conversation has no user message")
    return found


def _assistant(index: int, turn: dict[str, Any], expect_reasoning: bool,
               strict_think_markers: bool) -> list[str]:
    found: list[str] = []
    reasoning = turn.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        found.append(f"assistant message {index} reasoning_content must be a string or null")
    if expect_reasoning and (not isinstance(reasoning, str) or not reasoning.strip()):
        found.append(f"assistant message {index} has empty reasoning_content")
    if strict_think_markers:
        for name, text in (("content", turn.get("content")), ("reasoning_content", reasoning)):
            if isinstance(text, str) and any(m in text.lower() for m in THINK_MARKERS):
                found.append(f"assistant message {index} {name} contains a thinking marker")
    return found
