"""A thinking simulator follows each prompt as Qwen3.6's official chat template renders it
(producer/templates): `<think>\\n` at the end (thinking on) starts the answer inside the
reasoning, `<think>\\n\\n</think>\\n\\n` (`enable_thinking: false`, for the run or a row's own
`chat_template_kwargs`) answers without any. Checked on the exact ids the producer sends, over
real HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from fleetgen.simulator.answers import THINK_END_ID, THINK_START_ID, Opening, opening
from producer.tokenizer import load_tokenizer
from tests.support.sim import StartSim

CHATS = {
    "one turn": [{"role": "user", "content": "Why is the sky blue?"}],
    "history with reasoning": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "user", "content": "And 3+3?"}],
}
OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def prompts() -> dict[tuple[str, str], list[int]]:
    """(chat, how) -> the ids: the run's default, the run switched off, a row switched off."""
    run = load_tokenizer("qwen3.6")
    run_off = load_tokenizer("qwen3.6", chat_template_kwargs=OFF)
    out: dict[tuple[str, str], list[int]] = {}
    for name, chat in CHATS.items():
        for how, text in (("on", run.render(chat)), ("run off", run_off.render(chat)),
                          ("row off", run.render(chat, OFF))):
            out[(name, how)] = run.encode_batch([text])[0]
    return out


def test_the_official_templates_endings_are_the_ids_the_simulator_reads(
        prompts: dict[tuple[str, str], list[int]]) -> None:
    for (name, how), ids in prompts.items():
        if how == "on":
            assert ids[-2:] == [THINK_START_ID, 198], name
            assert opening(ids) is Opening.INSIDE, name
        else:
            assert ids[-4:] == [THINK_START_ID, 271, THINK_END_ID, 271], (name, how)
            assert opening(ids) is Opening.ANSWER, (name, how)


def test_a_thinking_simulator_reasons_exactly_when_the_prompt_left_the_block_open(
        prompts: dict[tuple[str, str], list[int]], start_sim: StartSim) -> None:
    sim = start_sim(thinking=True, output_tokens_mean=12, context_length=2048)
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        for (name, how), ids in prompts.items():
            body: dict[str, Any] = client.post("/generate", json={
                "input_ids": ids, "sampling_params": {
                    "max_new_tokens": 400, "skip_special_tokens": False}}).json()
            out, text = body["output_ids"], body["text"]
            assert THINK_START_ID not in out and "<think>" not in text, (name, how)
            if how == "on":  # inside the block the prompt opened: reasoning, then the answer
                assert THINK_END_ID in out and text.index("</think>") > 0, name
            else:
                assert THINK_END_ID not in out and "</think>" not in text, (name, how)
