"""The built-in qwen3.6 tokenizer renders exactly as Qwen3.6's official chat template.

Each expected text below is written out from the official template's own rules (the shipped
`producer/templates/qwen3.6-27b.chat_template.jinja`, which is the model's file byte for byte),
and compared token for token with what the producer sends. A change to the template, to the
way it is rendered (transformers' apply_chat_template) or to the message preparation shows
here as the first differing token.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from fleetgen.errors import ContentError
from producer.qwen_build import QWEN_CHAT_TEMPLATE, QWEN_TEMPLATE_FILE
from producer.rows import BadRow, Row, parse_row
from producer.tokenizer import QwenTokenizer, load_tokenizer

SOURCES = QWEN_TEMPLATE_FILE.parent / "SOURCES.md"


@pytest.fixture(scope="module")
def tok(built_tokenizer: QwenTokenizer) -> QwenTokenizer:
    return built_tokenizer


def same_tokens(tok: QwenTokenizer, got: str, expected: str) -> None:
    """Token for token, naming the first position where they differ."""
    got_ids, want_ids = tok.encode_batch([got, expected])
    for index, (a, b) in enumerate(zip(got_ids, want_ids, strict=False)):
        assert a == b, (f"token {index}: got {a} {tok.decode([a])!r}, "
                        f"official {b} {tok.decode([b])!r}")
    assert len(got_ids) == len(want_ids), f"{len(got_ids)} tokens, official {len(want_ids)}"
    assert got == expected


def test_the_shipped_file_is_the_official_template() -> None:
    data = QWEN_TEMPLATE_FILE.read_bytes()
    digest = re.search(r"sha256 `([0-9a-f]{64})`", SOURCES.read_text())
    assert digest is not None, "SOURCES.md names the file's sha256"
    assert hashlib.sha256(data).hexdigest() == digest.group(1)
    assert len(data.decode()) == 7764 and not data.endswith(b"\n")
    assert data.decode() == QWEN_CHAT_TEMPLATE
    # The two rules that set Qwen3.6 apart from the Qwen3.5 template it grew from.
    assert "(preserve_thinking is defined and preserve_thinking is true)" in QWEN_CHAT_TEMPLATE
    assert "{{- '<think>\\n' }}" in QWEN_CHAT_TEMPLATE


def test_the_cached_tokenizer_carries_the_official_template(tok: QwenTokenizer) -> None:
    assert tok.hf.chat_template == QWEN_CHAT_TEMPLATE
    assert Path(tok.cache_path, "chat_template.jinja").read_text() == QWEN_CHAT_TEMPLATE


def test_generation_prompt_opens_the_think_block_by_default(tok: QwenTokenizer) -> None:
    same_tokens(tok, tok.render([{"role": "user", "content": "  Name a prime.\n"}]),
                "<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_thinking_off_renders_the_empty_block(tok: QwenTokenizer) -> None:
    messages = [{"role": "user", "content": "Name a prime."}]
    same_tokens(tok, tok.render(messages, {"enable_thinking": False}),
                "<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n"
                "<think>\n\n</think>\n\n")
    same_tokens(tok, tok.render(messages, {"enable_thinking": True}),
                "<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n<think>\n")


HISTORY = [
    {"role": "system", "content": "You are terse. "},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "\nAdd them.\n"},
    {"role": "user", "content": "3+3?"},
]


def test_history_reasoning_is_dropped_before_the_last_query(tok: QwenTokenizer) -> None:
    same_tokens(tok, tok.render(HISTORY),
                "<|im_start|>system\nYou are terse.<|im_end|>\n"
                "<|im_start|>user\n2+2?<|im_end|>\n"
                "<|im_start|>assistant\n4<|im_end|>\n"
                "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_preserve_thinking_keeps_history_reasoning(tok: QwenTokenizer) -> None:
    same_tokens(tok, tok.render(HISTORY, {"preserve_thinking": True}),
                "<|im_start|>system\nYou are terse.<|im_end|>\n"
                "<|im_start|>user\n2+2?<|im_end|>\n"
                "<|im_start|>assistant\n<think>\nAdd them.\n</think>\n\n4<|im_end|>\n"
                "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_think_block_inside_history_content_is_split_out(tok: QwenTokenizer) -> None:
    inline = [{"role": "user", "content": "a"},
              {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"},
              {"role": "user", "content": "c"}]
    same_tokens(tok, tok.render(inline),
                "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n<think>\n")
    same_tokens(tok, tok.render(inline, {"preserve_thinking": True}),
                "<|im_start|>user\na<|im_end|>\n"
                "<|im_start|>assistant\n<think>\nr\n</think>\n\nb<|im_end|>\n"
                "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize(("messages", "why"), [
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "late"}],
     "System message must be at the beginning"),
    ([{"role": "developer", "content": "d"}, {"role": "user", "content": "a"}],
     "Unexpected message role"),
    ([{"role": "system", "content": "only a system turn"}], "No user query found"),
])
def test_what_the_official_template_refuses_is_a_content_error(
        tok: QwenTokenizer, messages: list, why: str) -> None:
    with pytest.raises(ContentError, match=why):
        tok.render(messages)


@pytest.mark.parametrize(("row", "reason"), [
    ({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]},
     "unsupported_tools"),
    ({"messages": [{"role": "user", "content": "a"},
                   {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                   {"role": "tool", "content": "42"}, {"role": "user", "content": "b"}]},
     "unsupported_turn"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "42"}]},
     "unsupported_turn"),
])
def test_rows_with_tools_are_rejected_with_a_reason(row: dict, reason: str) -> None:
    parsed = parse_row(1, row)
    assert isinstance(parsed, BadRow)
    assert parsed.reason.startswith(reason + ":")


def test_a_row_s_own_template_kwargs_are_parsed_and_checked() -> None:
    row = parse_row(1, {"messages": [{"role": "user", "content": "a"}],
                        "chat_template_kwargs": {"enable_thinking": False}})
    assert isinstance(row, Row) and row.template_kwargs == {"enable_thinking": False}
    bad = parse_row(2, {"prompt": "x", "chat_template_kwargs": "no"})
    assert isinstance(bad, BadRow) and bad.reason.startswith("bad_option: chat_template_kwargs")


def test_a_row_s_template_kwargs_go_over_the_run_s(tok: QwenTokenizer) -> None:
    quiet = load_tokenizer("qwen3.6", tok.cache_path.parent,
                           chat_template_kwargs={"enable_thinking": False})
    messages = [{"role": "user", "content": "a"}]
    assert quiet.render(messages).endswith("<think>\n\n</think>\n\n")
    assert quiet.render(messages, {"enable_thinking": True}).endswith("assistant\n<think>\n")


def test_history_reasoning_survives_row_parsing(tok: QwenTokenizer) -> None:
    row = parse_row(1, {"conversations": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "user", "content": "3+3?"}]})
    assert isinstance(row, Row) and row.messages is not None
    assert row.messages[1]["reasoning_content"] == "Add them."
    assert "<think>\nAdd them.\n</think>" in tok.render(row.messages, {"preserve_thinking": True})
