"""`--token-ids` at the engine floor and around it: every client asks its engine for the ids in
the engine's own names and gets the simulator's own back over real HTTP; the start-up probe, the
worker's check and the producer's refusal of a server that returns none; the flag pinned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetgen import errors
from fleetgen.engine import GenerateOptions
from fleetgen.engine.api import ServerLimits
from fleetgen.engine.openai import PROTOCOL as OPENAI
from fleetgen.engine.openai import completion_body, parse_completion
from fleetgen.engine.preflight import returns_token_ids
from fleetgen.engine.sglang import PROTOCOL as SGLANG
from fleetgen.records.outcomes import Generation
from fleetgen.records.reasoning import split_reasoning
from fleetgen.simulator.answers import compose
from fleetgen.simulator.model import request_key
from producer.build import check_token_ids as producer_check
from producer.manifest import check_same_settings
from producer.rows import BadRow, Row, parse_row
from producer.settings import ProducerSettings
from tests.support.sim import StartSim
from workers.generate import check_token_ids as worker_check

IDS = GenerateOptions(token_ids=True)
PROMPT = [101, 102, 103]


@pytest.mark.parametrize(("protocol", "flavor"), [(SGLANG, "sglang"), (OPENAI, "sglang"),
                                                  (OPENAI, "vllm")],
                         ids=["sglang-native", "sglang-v1", "vllm-v1"])
def test_each_client_gets_the_simulators_output_ids(start_sim: StartSim, protocol: Any,
                                                    flavor: str) -> None:
    sim = start_sim(flavor=flavor, output_tokens_mean=12, context_length=1024)
    client = protocol.connect(sim.url, timeout_s=10, concurrency=1)
    try:
        gen = client.generate(PROMPT, 50, {}, "ids:1:ab", IDS)
        probe = returns_token_ids(client)
    finally:
        client.close()
    answer = compose(request_key(0, PROMPT, 0, None), 12, 50, PROMPT)
    assert gen.output_ids == answer.output_ids and len(answer.output_ids) > 1
    assert probe.ok, probe.detail


def test_bodies_ask_in_each_engines_names() -> None:
    for engine in ("vllm", "sglang"):
        assert completion_body([1], 8, {}, None, IDS, engine)["return_token_ids"] is True
    llama = completion_body([1], 8, {}, None, IDS, "llama.cpp")
    assert (llama["return_tokens"], llama["verbose"]) == (True, True)
    assert "return_token_ids" not in llama
    # llama.cpp's OpenAI answer holds them only under `__verbose` (its native shape).
    gen = parse_completion({"choices": [{"text": "ab", "index": 0, "finish_reason": "stop",
                                         "logprobs": None}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 2},
                            "__verbose": {"content": "ab", "tokens": [7, 8]}})
    assert gen.output_ids == [7, 8]


def llama_answer(text: str, tokens: list[int], stop_type: str, word: str) -> dict[str, Any]:
    """llama-server's /v1/completions answer with `return_tokens` and `verbose`, as recorded
    from the tests' real server (tests/real_engines; timings and settings left out)."""
    return {"choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}],
            "object": "text_completion", "model": "qwen3.6-tiny.gguf",
            "usage": {"completion_tokens": len(tokens), "prompt_tokens": 40,
                      "total_tokens": 40 + len(tokens), "prompt_tokens_details": {
                          "cached_tokens": 39}},
            "__verbose": {"index": 0, "content": text, "tokens": tokens, "id_slot": 3,
                          "stop": True, "tokens_predicted": len(tokens), "tokens_evaluated": 40,
                          "has_new_line": "\n" in text, "truncated": False,
                          "stop_type": stop_type, "stopping_word": word, "tokens_cached": 45}}


def test_llama_cpp_stop_word_is_read_from_verbose() -> None:
    """Its OpenAI choice names no stop: `stopping_word` under `__verbose` says a stop string
    ended the answer, so a stop at `</think>` leaves the reasoning unfinished and the
    completion empty, as on SGLang and vLLM; an end-of-turn stop names none."""
    thought = [248068, 198, 1719, 1558, 198, 248069]
    gen = parse_completion(llama_answer("<think>\nthe model\n", thought, "word", "</think>"))
    assert gen.stop_matched == "</think>" and gen.output_ids == thought
    split = split_reasoning(gen.text, gen.output_ids, stopped=gen.stop_matched is not None)
    assert (split.reasoning, split.completion, split.unfinished) == ("the model", "", True)
    ended = parse_completion(llama_answer("the model", [1719, 1558, 248046], "eos", ""))
    assert ended.stop_matched is None and ended.output_ids == [1719, 1558, 248046]
    assert ended.completion_tokens == 3


class FakeEngine:
    """An engine whose answers hold `ids` as their output ids."""

    base_url = "http://fake"

    def __init__(self, ids: list[int] | None) -> None:
        self.ids = ids

    def generate(self, input_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                 rid: str, options: GenerateOptions = IDS) -> Generation:
        return Generation("ab", "length", len(input_ids), 2, 0, 0.0, output_ids=self.ids)

    def close(self) -> None:
        pass


class FakeProtocol:
    name = "openai"

    def __init__(self, ids: list[int] | None) -> None:
        self.ids = ids

    def connect(self, url: str, **_: Any) -> FakeEngine:
        return FakeEngine(self.ids)


@pytest.mark.parametrize(("ids", "said"), [(None, "the answer holds no output token ids"),
                                           ([1], "1 output token ids for 2")])
def test_a_server_without_ids_is_refused_before_the_run(ids: list[int] | None,
                                                        said: str) -> None:
    assert not returns_token_ids(FakeEngine(ids)).ok  # type: ignore[arg-type]
    assert returns_token_ids(FakeEngine([1, 2])).ok  # type: ignore[arg-type]
    settings = ProducerSettings(input=Path("p.jsonl"), run="r", redis_url="redis://x",
                                engine_url=("http://a",), token_ids=True)
    servers = {"http://a": ServerLimits(context_length=100, engine="vllm")}
    with pytest.raises(errors.ConfigError, match=f"http://a \\(vllm.*cannot return token "
                                                 f"ids: {said}"):
        producer_check(settings, FakeProtocol(ids), servers)  # type: ignore[arg-type]
    producer_check(settings, FakeProtocol([1, 2]), servers)  # type: ignore[arg-type]


def test_the_worker_fails_an_answer_without_its_ids() -> None:
    gen = Generation("ab", "stop", 3, 2, 0, 0.0, output_ids=None)
    worker_check(gen, GenerateOptions())  # not asked: fine
    with pytest.raises(errors.PermanentError, match="no output token ids"):
        worker_check(gen, IDS)
    with pytest.raises(errors.PermanentError, match="1 output token ids for 2"):
        worker_check(Generation("ab", "stop", 3, 2, 0, 0.0, output_ids=[5]), IDS)


def test_the_flag_is_pinned_and_a_rows_template_kwargs_must_be_an_object() -> None:
    with pytest.raises(errors.ConfigError, match="--token-ids false, now true"):
        check_same_settings("r", {"token_ids": False}, {"token_ids": True})
    check_same_settings("r", {}, {"token_ids": True})  # a run from before the flag
    row = parse_row(1, {"messages": [{"role": "user", "content": "hi"}],
                        "chat_template_kwargs": {"enable_thinking": True}})
    assert isinstance(row, Row) and row.template_kwargs == {"enable_thinking": True}
    bad = parse_row(2, {"prompt": "hi", "chat_template_kwargs": "yes"})
    assert isinstance(bad, BadRow) and bad.reason.startswith("bad_option: chat_template_kwargs")
