"""fleetgen against a real engine: llama.cpp's llama-server with the real Qwen3.6 vocabulary.

What is pinned here is llama.cpp's side of the contract fleetgen relies on: it tokenizes the
rendered chat exactly as fleetgen does, it reports its per-slot context in /props, and its
length rule (a prompt of n_ctx tokens or more is refused with a 400 naming both numbers; a
shorter one may generate n_ctx - prompt tokens)."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetgen.errors import ContentError
from producer.rows import Row, read_rows
from producer.tokenizer import _PROBES, QWEN_SPECIAL_IDS, QwenTokenizer, load_tokenizer
from tests.support.llama import LlamaServer, llama_version
from tests.support.pipeline import make_prompts

SAMPLE_PROMPTS = Path(__file__).parents[2] / "fleetgen" / "data" / "sample_prompts.jsonl"
SLOT_CTX = 4096  # -c 16384 shared by -np 4 slots
FILLER = list(range(1000, 1000 + 3000))  # ordinary (non-special) token ids


@pytest.fixture(scope="module")
def tokenizer() -> QwenTokenizer:
    tok = load_tokenizer("qwen3.6")
    assert isinstance(tok, QwenTokenizer)
    return tok


@pytest.fixture(scope="module")
def http(llama: LlamaServer) -> Any:
    with httpx.Client(base_url=llama.url, timeout=120.0) as client:
        yield client


def prompt_ids(n: int) -> list[int]:
    return [FILLER[i % len(FILLER)] for i in range(n)]


def rendered_rows(tok: QwenTokenizer, tmp_path: Path) -> list[tuple[str, str]]:
    """(id, rendered chat) for every usable row of the sample prompts, the e2e generator's
    rows, and the tokenizer's own probe texts (digits, whitespace runs, marks, emoji)."""
    e2e = tmp_path / "e2e.jsonl"
    make_prompts(e2e, 150, seed=11)
    rows: list[tuple[str, str]] = []
    for source in (SAMPLE_PROMPTS, e2e):
        for row in read_rows(source):
            if not isinstance(row, Row):
                continue
            try:
                text = row.prompt if row.prompt is not None else tok.render(row.messages or [])
            except ContentError:
                continue
            rows.append((f"{source.stem}:{row.id}", text))
    for i, probe in enumerate(_PROBES):
        rows.append((f"probe:{i}", tok.render([{"role": "user", "content": probe}])))
    return rows


def llama_tokenize(http: httpx.Client, text: str) -> list[int]:
    response = http.post("/tokenize", json={"content": text, "parse_special": True,
                                            "add_special": False})
    response.raise_for_status()
    return [int(t) for t in response.json()["tokens"]]


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def test_llama_tokenizes_rendered_chats_as_fleetgen_does(
        tokenizer: QwenTokenizer, http: httpx.Client, tmp_path: Path) -> None:
    rows = rendered_rows(tokenizer, tmp_path)
    ours = tokenizer.encode_batch([text for _, text in rows])
    disagree = []
    for (row_id, text), ids in zip(rows, ours, strict=True):
        # llama.cpp does not normalize; fleetgen tokenizes the NFC form (as Qwen's tokenizer
        # does), so the engine is handed NFC text to compare like with like.
        theirs = llama_tokenize(http, unicodedata.normalize("NFC", text))
        if theirs != ids:
            at = first_difference(ids, theirs)
            disagree.append(f"{row_id}: at token {at} fleetgen {ids[at:at + 5]} "
                            f"llama.cpp {theirs[at:at + 5]}")
    chats = sum(QWEN_SPECIAL_IDS["<|im_start|>"] in ids for ids in ours)
    tokens = sum(len(ids) for ids in ours)
    print(f"\ntokenizer agreement with llama.cpp {llama_version()}: "
          f"{len(rows) - len(disagree)}/{len(rows)} rows ({chats} rendered chats, the rest raw "
          f"prompts), {tokens} tokens")
    assert len(rows) >= 400 and chats >= 350  # most through the template, specials and all
    assert not disagree, f"{len(disagree)} of {len(rows)} rows differ:\n" + "\n".join(disagree[:10])


def test_llama_does_not_normalize_but_fleetgen_does(
        tokenizer: QwenTokenizer, http: httpx.Client) -> None:
    # Why the comparison above hands llama.cpp NFC text: a decomposed 'é' is two tokens' worth
    # of bytes to llama.cpp and the composed character to fleetgen. Harmless for fleetgen,
    # which sends ids, never text; a change here would show up as a llama.cpp release note.
    text = "Cafe\u0301 au lait"
    assert llama_tokenize(http, unicodedata.normalize("NFC", text)) == tokenizer.encode_batch(
        [text])[0]
    assert llama_tokenize(http, text) != tokenizer.encode_batch([text])[0]


def test_props_reports_the_slot_context_and_slots(http: httpx.Client) -> None:
    props = http.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == SLOT_CTX
    assert props["total_slots"] == 4


def test_a_prompt_of_n_ctx_tokens_is_refused_with_both_numbers(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"prompt": prompt_ids(SLOT_CTX),
                                                   "max_tokens": 1})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    print(f"\nllama.cpp 400 body: {response.text}")
    assert error["type"] == "exceed_context_size_error"
    assert error["n_prompt_tokens"] == SLOT_CTX
    assert error["n_ctx"] == SLOT_CTX


@pytest.mark.parametrize("room", [1, 7])
def test_a_shorter_prompt_generates_exactly_n_ctx_minus_prompt(
        http: httpx.Client, room: int) -> None:
    prompt = prompt_ids(SLOT_CTX - room)
    response = http.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": 1000, "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200, response.text
    body = response.json()
    print(f"\nprompt {len(prompt)}: {body['usage']}, {body['choices'][0]['finish_reason']}")
    assert body["usage"]["prompt_tokens"] == len(prompt)
    assert body["usage"]["completion_tokens"] == room
    assert body["choices"][0]["finish_reason"] == "length"
