"""What a result record says about its input row and its answer (pure): which conversation it
answered, in which turn style, which endpoint it stands for, and the answer with or without
its reasoning."""

from __future__ import annotations

from typing import Any, Final

from fleetgen.records import outcomes

# The transport fields of an OpenAI Batch input line, carried through as row fields; `body`
# holds the request itself.
BATCH_FIELDS: Final = frozenset({"custom_id", "method", "url", "body"})
CONVERSATION_FIELDS: Final = ("messages", "conversations", "prompt")  # the producer's order

# ShareGPT speakers and the roles they stand for: the producer's own SHAREGPT_ROLES
# (producer/conversation.py; tests/exporter checks the two agree). The exporter writes every
# turn as role/content, the shape trainers read.
SHAREGPT_ROLES: Final = {"human": "user", "user": "user", "gpt": "assistant",
                         "assistant": "assistant", "system": "system", "chatgpt": "assistant",
                         "bing": "assistant"}
SHAREGPT_ASSISTANT: Final = frozenset(k for k, v in SHAREGPT_ROLES.items() if v == "assistant")

CHAT_URL: Final = "/v1/chat/completions"
COMPLETIONS_URL: Final = "/v1/completions"

# --reasoning: keep it beside the answer (a field of its own), strip it, or inline it before
# the answer as Qwen3-style chat templates render an assistant turn's reasoning_content.
REASONING_MODES: Final = ("keep", "strip", "inline")
THINK_OPEN: Final = "<think>\n"
THINK_CLOSE: Final = "\n</think>\n\n"


def is_batch_row(record: dict[str, Any]) -> bool:
    """The row was an OpenAI Batch line: `url` and the request `body` carried through."""
    return isinstance(record.get("body"), dict) and isinstance(record.get("url"), str)


def endpoint(record: dict[str, Any]) -> str:
    """The URL the row stands for: a Batch line's own, else chat for a conversation and
    completions for a raw `prompt` row."""
    if is_batch_row(record):
        url = str(record["url"])
        return COMPLETIONS_URL if url.rstrip("/").endswith(COMPLETIONS_URL) else CHAT_URL
    if any(key in record for key in ("messages", "conversations")):
        return CHAT_URL
    return COMPLETIONS_URL if "prompt" in record else CHAT_URL


def conversation(record: dict[str, Any]) -> tuple[str, list[Any]]:
    """(the field to write it under, the turns asked about): the input's own turns, less the
    trailing assistant turns the producer dropped; a prompt becomes one user turn."""
    source = record["body"] if is_batch_row(record) else record
    for key in CONVERSATION_FIELDS:
        if key not in source or source[key] is None:
            continue
        value = source[key]
        if key == "prompt":
            return "messages", [{"role": "user", "content": prompt_text(value)}]
        turns = list(value) if isinstance(value, list) else []
        while turns and is_assistant(turns[-1]):
            turns.pop()
        return ("messages" if source is not record else key), turns
    return "messages", []


def prompt_text(value: Any) -> Any:
    # A completions body may hold a one-element list of prompts.
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    return value


def is_assistant(turn: Any) -> bool:
    if not isinstance(turn, dict):
        return False
    if "from" in turn or "value" in turn:
        return str(turn.get("from", "")).lower() in SHAREGPT_ASSISTANT
    return turn.get("role") == "assistant"


def role_turn(turn: Any) -> Any:
    """A turn as `{role, content}`: a ShareGPT `from`/`value` turn converted (its other keys
    kept), a role/content turn as it is. Only rows the producer accepted reach a result, so
    every speaker is a known one; an unknown one would keep its name as the role."""
    if not isinstance(turn, dict) or not ("from" in turn or "value" in turn):
        return turn
    speaker = str(turn.get("from", ""))
    converted = {"role": SHAREGPT_ROLES.get(speaker.lower(), speaker),
                 "content": turn.get("value")}
    converted.update((k, v) for k, v in turn.items() if k not in ("from", "value"))
    return converted


def answer(record: dict[str, Any], reasoning: str) -> tuple[str, str | None]:
    """(the answer's text, its reasoning as a field of its own or None) under a --reasoning
    mode. Inline, an answer cut off inside its reasoning keeps the block open: no closing tag
    the model never wrote."""
    completion = str(record.get("completion") or "")
    thought = record.get("reasoning")
    if not isinstance(thought, str) or reasoning == "strip":
        return completion, None
    if reasoning == "keep":
        return completion, thought
    if record.get("reasoning_unfinished") is True:
        return THINK_OPEN + thought, None
    return THINK_OPEN + thought + THINK_CLOSE + completion, None


def row_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The input row's own fields (`outcomes.split_result`: those named like fleetgen's
    too), less its conversation and a Batch line's transport."""
    return {k: v for k, v in outcomes.split_result(record).row.items()
            if k not in BATCH_FIELDS and k not in CONVERSATION_FIELDS}


def user_turns(turns: list[Any]) -> list[list[Any]]:
    """Role/content turns cut at their assistant turns (which are dropped): the messages each
    regenerated turn of a `--turns all` run answered (the producer's producer/turns.py rule)."""
    asked: list[list[Any]] = [[]]
    for turn in turns:
        if isinstance(turn, dict) and turn.get("role") == "assistant":
            if asked[-1]:
                asked.append([])
            continue
        asked[-1].append(turn)
    return [a for a in asked if a]
