"""The prompt of a row, in any shape fleetgen reads (`messages`, ShareGPT or role/content
`conversations`, a raw `prompt`), as chat messages or as text; ValueError names what is wrong."""

from __future__ import annotations

from typing import Any

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "chatgpt": "assistant", "bing": "assistant"}
ROLES = {"system", "user", "assistant", "tool", "developer"}


def conversation(obj: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str | None]:
    """A plain row's (messages, None) or (None, prompt)."""
    if obj.get("tools"):
        raise ValueError("unsupported_tools: the row offers tools; fleetgen renders text "
                         "conversations only (the template's tool prompt is not sent)")
    if "messages" in obj:
        return messages(obj["messages"], "messages"), None
    if "conversations" in obj:
        return messages(obj["conversations"], "conversations"), None
    if "prompt" in obj:
        return None, prompt_text(obj["prompt"], "prompt")
    raise ValueError("no_prompt: the row has none of messages, conversations, prompt")


def prompt_text(prompt: Any, label: str) -> str:
    if not isinstance(prompt, str):
        raise ValueError(f"bad_prompt: {label} must be a string, got {kind(prompt)}")
    if not prompt.strip():
        raise ValueError(f"empty_prompt: {label} is empty")
    return prompt


def messages(turns: Any, name: str, label: str | None = None) -> list[dict[str, Any]]:
    """`name` makes the reason's code (bad_messages, empty_conversations); `label` names
    the field in its text (body.messages), `name` by default."""
    label = label or name
    if not isinstance(turns, list):
        raise ValueError(f"bad_{name}: {label} must be a list of turns, got {kind(turns)}")
    result = [_turn(t, i, name, label) for i, t in enumerate(turns)]
    # A trailing assistant turn is the answer we are about to regenerate.
    while result and result[-1]["role"] == "assistant":
        result.pop()
    if not result:
        raise ValueError(f"empty_{name}: no turn left to answer")
    # One rule with a raw prompt's: nothing to answer is an empty prompt, whatever its shape.
    if not _text(result[-1]["content"]).strip():
        raise ValueError(f"empty_prompt: {label} turn {len(result) - 1}, the one to answer, "
                         "is empty")
    return result


def _text(content: str | list[Any]) -> str:
    """A turn's text: the string, or its parts' (a part that is not text counts as some)."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" if isinstance(part, dict) and
                   part.get("type", "text") == "text" else "[part]" for part in content)


def _turn(turn: Any, index: int, name: str, label: str) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise ValueError(f"bad_{name}: {label} turn {index} must be an object, "
                         f"got {kind(turn)}")
    if "from" in turn or "value" in turn:
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        content = turn.get("value")
    else:
        role = turn.get("role") if turn.get("role") in ROLES else None
        content = turn.get("content")
    if role is None:
        got = turn.get("from", turn.get("role"))
        raise ValueError(f"bad_{name}: {label} turn {index} has unknown role {got!r}")
    if role == "tool" or turn.get("tool_calls"):
        # Their rendering needs the row's tools in the system prompt, which fleetgen does not
        # send: rendered without them, the prompt would not be the model's.
        raise ValueError(f"unsupported_turn: {label} turn {index} is a tool "
                         f"{'result' if role == 'tool' else 'call'}; fleetgen renders text "
                         "conversations only")
    if not isinstance(content, str | list):
        raise ValueError(f"bad_{name}: {label} turn {index} content must be text, "
                         f"got {kind(content)}")
    result: dict[str, Any] = {"role": role, "content": content}
    reasoning = turn.get("reasoning_content")
    if role == "assistant" and isinstance(reasoning, str):
        result["reasoning_content"] = reasoning  # history reasoning, the template decides
    return result


def kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
