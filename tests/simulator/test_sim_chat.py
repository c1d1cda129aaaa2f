"""The simulator's chat endpoints: SGLang's /v1/chat/completions and /tokenize (both flavours)
render messages with the chat template file and count with the Qwen3.6 vocabulary, as fleetgen's
own tokenizer does (the reference here), with SGLang 0.5.23's answer and error shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetgen.simulator import SimConfig
from fleetgen.simulator.chat import DEFAULT_TEMPLATE
from fleetgen.simulator.cli import add_arguments, config_from_args
from producer.qwen_build import QWEN_TEMPLATE_FILE
from producer.tokenizer import load_tokenizer
from tests.support.sim import StartSim

CONVERSATIONS: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
    ([{"role": "user", "content": "Hi!"}], {}),
    ([{"role": "user", "content": "Hi!"}], {"enable_thinking": False}),
    # Non-ASCII and a decomposed é (NFC), a list of text parts, a reasoning_content history.
    ([{"role": "system", "content": "  Réponds en français. "},
      {"role": "user", "content": [{"type": "text", "text": "Cafe\u0301 "},
                                   {"type": "text", "text": "日本語?"}]},
      {"role": "assistant", "content": "Oui.", "reasoning_content": "think"},
      {"role": "user", "content": "Encore"}], {}),
    ([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "<think>\nr\n</think>\n\ny"},
      {"role": "user", "content": "z"}], {"preserve_thinking": True}),
]


@pytest.fixture(scope="module")
def reference() -> Any:
    return load_tokenizer("qwen3.6")


def test_the_default_template_is_the_one_fleetgen_ships() -> None:
    assert DEFAULT_TEMPLATE.resolve() == QWEN_TEMPLATE_FILE.resolve()


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
@pytest.mark.parametrize(("messages", "kwargs"), CONVERSATIONS)
def test_tokenize_renders_as_fleetgen_does(start_sim: StartSim, reference: Any, flavor: str,
                                           messages: list[dict[str, Any]],
                                           kwargs: dict[str, Any]) -> None:
    sim = start_sim(flavor=flavor)
    expected = reference.encode_batch([reference.render(messages, kwargs)])[0]
    answer = httpx.post(f"{sim.url}/tokenize", json={
        "messages": messages, "chat_template_kwargs": kwargs, "add_generation_prompt": True})
    assert answer.status_code == 200, answer.text
    # vLLM's TokenizeResponse also has `token_strs` (null unless return_token_strs).
    extra = {"token_strs": None} if flavor == "vllm" else {}
    assert answer.json() == {"tokens": expected, "count": len(expected),
                             "max_model_len": 8192, **extra}


@pytest.mark.parametrize(("messages", "kwargs"), CONVERSATIONS)
def test_chat_usage_counts_the_rendered_prompt(start_sim: StartSim, reference: Any,
                                               messages: list[dict[str, Any]],
                                               kwargs: dict[str, Any]) -> None:
    sim = start_sim()
    expected = len(reference.encode_batch([reference.render(messages, kwargs)])[0])
    answer = httpx.post(f"{sim.url}/v1/chat/completions", json={
        "model": "fleetgen-sim", "messages": messages, "chat_template_kwargs": kwargs,
        "max_tokens": 1})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "chat.completion"
    # SGLang's UsageInfo (protocol.py): reasoning_tokens 0 without a reasoning parser.
    assert body["usage"] == {"prompt_tokens": expected, "completion_tokens": 1,
                             "total_tokens": expected + 1, "prompt_tokens_details": None,
                             "reasoning_tokens": 0, "completion_tokens_details": None}
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"


def test_a_thinking_model_splits_reasoning_content(start_sim: StartSim) -> None:
    sim = start_sim(thinking=True, output_tokens_mean=6)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 200}
    thinking = httpx.post(f"{sim.url}/v1/chat/completions", json=chat).json()
    message = thinking["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"], message
    assert "think>" not in message["content"] + message["reasoning_content"]
    off = httpx.post(f"{sim.url}/v1/chat/completions", json={
        **chat, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert off["choices"][0]["message"]["reasoning_content"] is None


def test_template_errors_and_length_are_openai_400s(start_sim: StartSim) -> None:
    sim = start_sim(context_length=64)
    no_user = httpx.post(f"{sim.url}/v1/chat/completions", json={
        "messages": [{"role": "system", "content": "s"}]})
    assert no_user.status_code == 400
    assert no_user.json() == {"object": "error", "message": "No user query found in messages.",
                              "type": "BadRequestError", "param": None, "code": 400}
    long = httpx.post(f"{sim.url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "word " * 100}], "max_tokens": 1})
    assert long.status_code == 400
    assert long.json()["message"].startswith("The input (")
    bad_role = httpx.post(f"{sim.url}/tokenize", json={"messages": [{"role": "robot"}]})
    assert bad_role.status_code == 400 and "'role' must be one of" in bad_role.json()["message"]


def test_a_template_file_of_ones_own(start_sim: StartSim, tmp_path: Path) -> None:
    template = tmp_path / "plain.jinja"
    template.write_text("{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{%- endfor %}")
    sim = start_sim(chat_template=str(template))
    answer = httpx.post(f"{sim.url}/tokenize", json={"prompt": "user: hi"}).json()
    chat = httpx.post(f"{sim.url}/tokenize", json={
        "messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat == answer and chat["count"] == 3


def test_the_chat_template_flag(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    template = tmp_path / "t.jinja"
    template.write_text("x")
    assert config_from_args(parser.parse_args([])).chat_template is None
    config = config_from_args(parser.parse_args(["--chat-template", str(template)]))
    assert config.chat_template == str(template)
    with pytest.raises(ValueError, match=r"SimConfig\.chat_template must name a readable file"):
        SimConfig(chat_template=str(tmp_path / "missing.jinja"))
