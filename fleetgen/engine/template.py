"""`doctor`'s chat-template check: the same probe conversations rendered by the server's own chat
path and by fleetgen (its tokenizer and template), compared token for token where the server
gives its tokens, by count where it gives only a count.

What each engine is asked, read from its source:
- SGLang 0.5.23: `POST /v1/chat/completions` with `max_tokens: 1` (`serving_chat.py`
  `OpenAIServingChat._process_messages` -> `_apply_jinja_template` ->
  `_render_and_encode_chat_template`: `tokenizer.apply_chat_template(messages, tokenize=False,
  add_generation_prompt=True, **chat_template_kwargs)`, then encoded without special tokens);
  `usage.prompt_tokens` is that prompt's length (`_build_chat_response`, meta_info
  `prompt_tokens` via `_reported_prompt_tokens`; the speculative reserve is not in it). Then
  `POST /tokenize` with the same `messages` (`serving_tokenize.py`
  `OpenAIServingTokenize._tokenize_chat_request`, the same `_process_messages`) for the tokens
  themselves; an older server without it is compared by count only.
- vLLM: `POST /tokenize` with `messages`, `add_generation_prompt: true` and
  `chat_template_kwargs` (`TokenizeChatRequest`): `{count, max_model_len, tokens}`.
- llama.cpp: `POST /apply-template` (`server-context.cpp` `post_apply_template`: the chat
  path's `oaicompat_chat_params_parse` without inference, `chat_template_kwargs` merged over
  the server's) gives the prompt text; `POST /tokenize` with `add_special: true,
  parse_special: true` encodes it as the chat path does (`handle_completions_impl`:
  `tokenize_input_prompts(..., add_special=true, parse_special=true)`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import httpx

from fleetgen import errors
from fleetgen.engine import kinds
from fleetgen.engine.api import Difference, ServerLimits, ServerRendering
from fleetgen.engine.decision import from_status, from_transport, not_json
from fleetgen.engine.http import error_message, server_client
from fleetgen.engine.preflight import Check

Messages = Sequence[Mapping[str, Any]]
# Tokens shown on each side from the first difference on.
SHOWN_TOKENS = 6


@dataclass(frozen=True)
class ChatProbe:
    """One conversation rendered by both sides, with the template options it adds."""

    name: str
    messages: tuple[dict[str, str], ...]
    template_kwargs: dict[str, Any]  # over the run's --chat-template-kwargs


PROBES = (
    ChatProbe("one user turn",
              ({"role": "user", "content": "What is the capital of France?"},), {}),
    ChatProbe("one user turn, enable_thinking false",
              ({"role": "user", "content": "What is the capital of France?"},),
              {"enable_thinking": False}),
    ChatProbe("system + history with reasoning_content", (
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7", "reasoning_content": "Primes: 2, 3, 5, 7."},
        {"role": "user", "content": "And one larger than 100?"},
    ), {}),
)


class ChatRenderer(Protocol):
    """What the check needs of fleetgen's tokenizer (producer's `PromptTokenizer` and more)."""

    name: str

    def render(self, messages: Messages,
               template_kwargs: Mapping[str, Any] | None = None) -> str: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class Comparison:
    """One probe on one server; `agree` is None when the server could not render it."""

    probe: str
    template_kwargs: dict[str, Any]
    fleetgen_tokens: int | None  # None: fleetgen's own template refused the probe
    server_tokens: int | None = None
    via: str = ""
    agree: bool | None = None
    by_tokens: bool = False  # compared token for token, not by count alone
    first_difference: Difference | None = None
    error: str | None = None
    hint: str | None = None  # what is known to cause this engine's disagreement


def compare_templates(base_url: str, limits: ServerLimits, renderer: ChatRenderer,
                      run_kwargs: Mapping[str, Any], *, api_key: str | None = None,
                      timeout_s: float = 60.0) -> list[Comparison]:
    """Every probe through the server's chat path and through `renderer`; none for a kind that
    declares no chat path (it renders no chats, so nothing re-renders what it answered)."""
    kind = kinds.kind_of(limits.engine)
    if kind is not None and kind.render_chat is None:
        return []
    with server_client(base_url, api_key=api_key, timeout_s=timeout_s) as http:
        return [_compare(http, limits, renderer, probe, {**run_kwargs, **probe.template_kwargs})
                for probe in PROBES]


def _compare(http: httpx.Client, limits: ServerLimits, renderer: ChatRenderer, probe: ChatProbe,
             kwargs: dict[str, Any]) -> Comparison:
    messages = [dict(m) for m in probe.messages]
    try:
        ours = renderer.encode_batch([renderer.render(messages, kwargs)])[0]
    except errors.ContentError as exc:  # e.g. a --tokenizer whose template takes no system turn
        return Comparison(probe.name, kwargs, None, error=f"fleetgen's template refused it: {exc}")
    base = Comparison(probe.name, kwargs, len(ours))
    try:
        theirs = server_rendering(http, limits, messages, kwargs)
    except errors.EngineError as exc:
        return replace(base, error=exc.message)
    agree = theirs.prompt_tokens == len(ours) and (theirs.tokens is None or theirs.tokens == ours)
    difference = None if agree or theirs.tokens is None else \
        first_difference(theirs.tokens, ours, renderer)
    return replace(base, server_tokens=theirs.prompt_tokens, via=theirs.via, agree=agree,
                   by_tokens=theirs.tokens is not None, first_difference=difference,
                   hint=_hint(limits, difference))


# llama.cpp's server passes `preserve_reasoning: true` to every template unless started with
# --no-reasoning-preserve (`--reasoning-preserve`, "default: enabled"), which sets the Qwen
# template's `preserve_thinking`: every earlier turn keeps its reasoning, where transformers (and
# so SGLang, vLLM and the trainers) keep only the turns after the last user query.
LLAMA_PRESERVE_HINT = ("llama.cpp keeps every turn's reasoning by default: start it with "
                       "--no-reasoning-preserve to render history as the template's own default")


def _hint(limits: ServerLimits, difference: Difference | None) -> str | None:
    kind = kinds.kind_of(limits.engine)
    return kind.template_hint(difference) if kind and difference is not None else None


def llama_cpp_hint(difference: Difference) -> str | None:
    return LLAMA_PRESERVE_HINT if difference.server_text.startswith("<think>") else None


def first_difference(server: list[int], ours: list[int], renderer: ChatRenderer) -> Difference:
    position = next((i for i, (a, b) in enumerate(zip(server, ours, strict=False)) if a != b),
                    min(len(server), len(ours)))
    theirs_shown = server[position:position + SHOWN_TOKENS]
    ours_shown = ours[position:position + SHOWN_TOKENS]
    return Difference(position, theirs_shown, ours_shown, renderer.decode(theirs_shown),
                      renderer.decode(ours_shown))


def server_rendering(http: httpx.Client, limits: ServerLimits, messages: list[dict[str, Any]],
                     kwargs: dict[str, Any]) -> ServerRendering:
    """The server's rendering, as its kind declares it (SGLang's for a kind no module
    declared, as before kinds were registered)."""
    kind = kinds.kind_of(limits.engine)
    render = kind.render_chat if kind is not None and kind.render_chat else render_sglang
    return render(http, limits, messages, kwargs)


def render_vllm(http: httpx.Client, limits: ServerLimits, messages: list[dict[str, Any]],
                kwargs: dict[str, Any]) -> ServerRendering:
    tokens = _tokenize_messages(http, limits, messages, kwargs, add_generation_prompt=True)
    if tokens is None:
        raise errors.PermanentError("/tokenize does not render messages (404); a vLLM "
                                    "new enough to have it is needed for this check")
    return ServerRendering(len(tokens), tokens, "/tokenize")


def render_sglang(http: httpx.Client, limits: ServerLimits, messages: list[dict[str, Any]],
            kwargs: dict[str, Any]) -> ServerRendering:
    body: dict[str, Any] = {"messages": messages, "max_tokens": 1, "temperature": 0}
    if limits.model:
        body["model"] = limits.model
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    answer = _post(http, "/v1/chat/completions", body)
    usage = answer.get("usage") if isinstance(answer, dict) else None
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(count, int) or isinstance(count, bool):
        raise errors.PermanentError("/v1/chat/completions answered without usage.prompt_tokens")
    tokens = _tokenize_messages(http, limits, messages, kwargs, add_generation_prompt=False)
    via = "/v1/chat/completions usage.prompt_tokens"
    return ServerRendering(count, tokens, via + (", /tokenize" if tokens is not None else
                                                 " (no /tokenize: counts only)"))


def _tokenize_messages(http: httpx.Client, limits: ServerLimits, messages: list[dict[str, Any]],
                       kwargs: dict[str, Any], *, add_generation_prompt: bool,
                       ) -> list[int] | None:
    """The server's tokens for the messages, or None where /tokenize does not exist. SGLang
    renders them "as for a chat completion" when `add_generation_prompt` is left out
    (`TokenizeRequest`); vLLM's default is true, sent anyway."""
    body: dict[str, Any] = {"messages": messages}
    if add_generation_prompt:
        body["add_generation_prompt"] = True
    if limits.model:
        body["model"] = limits.model
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    try:
        answer = _post(http, "/tokenize", body)
    except errors.PermanentError as exc:
        if exc.status in (404, 405):
            return None
        raise
    return _token_list(answer, "/tokenize")


def render_llama_cpp(http: httpx.Client, limits: ServerLimits, messages: list[dict[str, Any]],
               kwargs: dict[str, Any]) -> ServerRendering:
    body: dict[str, Any] = {"messages": messages}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    rendered = _post(http, "/apply-template", body)
    prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
    if not isinstance(prompt, str):
        raise errors.PermanentError("/apply-template answered without a prompt")
    tokens = _token_list(_post(http, "/tokenize", {"content": prompt, "add_special": True,
                                                   "parse_special": True}), "/tokenize")
    return ServerRendering(len(tokens), tokens, "/apply-template, /tokenize")


def _token_list(answer: Any, path: str) -> list[int]:
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise errors.PermanentError(f"{path} answered without a list of token ids")
    return tokens


def _post(http: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    try:
        response = http.post(path, json=body)
    except httpx.HTTPError as exc:
        raise from_transport(exc) from exc
    if response.status_code != 200:
        raise from_status(response.status_code,
                          f"{path}: {response.status_code} {error_message(response)}")
    try:
        return response.json()
    except ValueError as exc:
        raise not_json(path, exc) from exc


# -- as check lines ---------------------------------------------------------------------------
def template_check(c: Comparison, renderer: ChatRenderer) -> Check:
    name = f"chat template, {c.probe}"
    if c.agree is None:
        who = "" if c.fleetgen_tokens is None else "the server could not render it: "
        return Check(name, False, f"not compared: {who}{c.error}")
    counts = f"server {c.server_tokens} tokens, fleetgen ({renderer.name}) {c.fleetgen_tokens}"
    if c.agree:
        same = "the same tokens" if c.by_tokens else "the same count"
        return Check(name, True, f"{counts}: {same} ({c.via})")
    detail = f"{counts} ({c.via})"
    d = c.first_difference
    if d is not None:
        detail += (f"; first difference at token {d.position}: server "
                   f"{_shown(d.server_text, d.server)}, fleetgen "
                   f"{_shown(d.fleetgen_text, d.fleetgen)}")
    fix = c.hint or ("serve the model's own template, or pass --tokenizer the server's")
    return Check(name, False, f"{detail}; the server renders chats differently from the "
                 f"template fleetgen counts with: {fix}")


def _shown(text: str, ids: list[int]) -> str:
    return f"{text!r} {ids}" if ids else "<end of prompt>"


def reasoning_line(limits: ServerLimits) -> str | None:
    """What the server's reasoning parser means for a JSON schema on a thinking prompt."""
    kind = kinds.kind_of(limits.engine)
    return kind.reasoning_note(limits) if kind else None


def vllm_reasoning(limits: ServerLimits) -> str | None:
    return ("reasoning parser unknown (vLLM's /v1/models does not say): a JSON schema's "
            "grammar waits for </think> only if it was started with --reasoning-parser")


def sglang_reasoning(limits: ServerLimits) -> str | None:
    if limits.reasoning_parser:
        return (f"reasoning parser {limits.reasoning_parser}: a JSON schema's grammar can wait "
                "for </think> (require_reasoning)")
    return ("no reasoning parser: a JSON schema's grammar holds from the first token, so a "
            "thinking prompt with a schema gets no reasoning (start it with "
            "--reasoning-parser qwen3)")
