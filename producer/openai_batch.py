"""OpenAI Batch request lines (`custom_id`, `method`, `url`, `body`): the id, the prompt and
the options of one request, or the reason fleetgen cannot send it."""

from __future__ import annotations

from typing import Any

from producer.conversation import kind, messages, prompt_text
from producer.rowsampling import Options, body_options

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"


def is_batch_line(obj: dict[str, Any]) -> bool:
    """A `body` and any of custom_id, method, url, and no prompt of the row's own (a plain row
    may well carry a field named `body`)."""
    if "body" not in obj:  # nearly every plain row: one lookup
        return False
    return (("custom_id" in obj or "url" in obj or "method" in obj)
            and "messages" not in obj and "conversations" not in obj and "prompt" not in obj)


def batch_id(obj: dict[str, Any]) -> tuple[str, str | None]:
    """(custom_id, None), or ("", reason)."""
    raw = obj.get("custom_id")
    if raw is None:
        return "", "bad_custom_id: a Batch line needs a custom_id"
    if not isinstance(raw, str) or not raw.strip():
        what = "empty" if isinstance(raw, str) else kind(raw)
        return "", f"bad_custom_id: custom_id must be a non-empty string, got {what}"
    return raw, None


def batch_request(obj: dict[str, Any]
                  ) -> tuple[list[dict[str, Any]] | None, str | None, Options]:
    """(messages, None, options) for /v1/chat/completions, (None, prompt, options) for
    /v1/completions; ValueError with the reason otherwise."""
    method = obj.get("method")
    if method is not None and (not isinstance(method, str) or method.upper() != "POST"):
        raise ValueError(f"bad_method: method must be POST, got {method!r}")
    url = obj.get("url")
    if url is not None and url not in (CHAT_URL, COMPLETIONS_URL):
        raise ValueError(f"unsupported_url: url {url!r} is not supported (fleetgen takes "
                         f"{CHAT_URL} and {COMPLETIONS_URL})")
    body = obj["body"]
    if not isinstance(body, dict):
        raise ValueError(f"bad_body: body must be an object, got {kind(body)}")
    has_messages, has_prompt = body.get("messages") is not None, body.get("prompt") is not None
    if has_messages and has_prompt:
        raise ValueError("bad_body: body has both messages and prompt")
    if not (has_messages or has_prompt):
        raise ValueError("no_prompt: body has neither messages nor prompt")
    got, need = ("messages", "prompt") if has_messages else ("prompt", "messages")
    if url is not None and url != (CHAT_URL if has_messages else COMPLETIONS_URL):
        raise ValueError(f"bad_body: {url} takes body.{need}, not body.{got}")
    if has_messages:
        turns, prompt = messages(body["messages"], "messages", "body.messages"), None
    else:
        turns, prompt = None, _completions_prompt(body["prompt"])
    return turns, prompt, body_options(body, ("messages", "prompt"))


def _completions_prompt(prompt: Any) -> str:
    """/v1/completions takes a string, a list of strings, token ids or lists of them: one
    text prompt per line is what fleetgen sends (it tokenizes with the run's tokenizer)."""
    if isinstance(prompt, list):
        if any(isinstance(p, int | list) for p in prompt):
            raise ValueError("bad_prompt: body.prompt holds token ids; give the text (fleetgen "
                             "tokenizes it with the run's tokenizer)")
        if len(prompt) != 1:
            raise ValueError(f"bad_prompt: body.prompt holds {len(prompt)} prompts; a Batch "
                             f"line carries one (one line per prompt)")
        prompt = prompt[0]
    return prompt_text(prompt, "body.prompt")
