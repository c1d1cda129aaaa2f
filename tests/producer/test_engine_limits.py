"""The producer's limits read from real servers (simulated SGLang over HTTP): the speculative
reserve and the server's own input limit enter the budget, several servers give the smallest
limits, an ignored --seed is said once, bad servers are one line with an exit code, and a JSON
schema on a thinking prompt needs servers whose grammar waits for the reasoning."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import redis

from fleetgen import exitcodes
from fleetgen.cli.main import main
from fleetgen.engine import PROTOCOLS
from fleetgen.engine.api import ServerLimits
from fleetgen.errors import ConfigError, EngineUnreachable
from fleetgen.queue.contract import Sampling
from fleetgen.runstate.keys import RunKeys
from producer.budget import budget
from producer.build import grammar_cannot_wait, resolve_limits, standalone_producer
from producer.settings import ProducerSettings
from tests.support.httpd import serving
from tests.support.sim import StartSim

# EAGLE with topk 2 x 4 steps and 6 draft tokens: SGLang reserves max(2 x 4, 6) = 8 tokens
# (srt/managers/utils.py `compute_num_reserved_tokens`).
EAGLE = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 4,
         "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6}
PROBE = 11


def settings(tmp_path: Path, *urls: str, **options: object) -> ProducerSettings:
    prompts = tmp_path / "p.jsonl"
    if not prompts.exists():
        prompts.write_text('{"prompt": "hi"}\n')
    return ProducerSettings(input=prompts, run="limits", redis_url="redis://127.0.0.1:9/0",
                            engine_url=urls, **options)  # type: ignore[arg-type]


def send(url: str, prompt_tokens: int, max_new_tokens: int) -> httpx.Response:
    return httpx.post(url + "/generate", timeout=30, json={
        "input_ids": [PROBE] * prompt_tokens,
        "sampling_params": {"max_new_tokens": max_new_tokens}})


def test_the_speculative_reserve_enters_the_budget_and_the_server_accepts_it(
        start_sim: StartSim, tmp_path: Path) -> None:
    sim = start_sim(context_length=4096, **EAGLE)
    limits = resolve_limits(settings(tmp_path, sim.url))
    assert limits.reserved_tokens == 8
    assert limits.max_req_input_len == 4096 - 8
    b = budget(100, limits)
    assert b.max_tokens == 4096 - 8 - 100 - 1
    assert send(sim.url, 100, b.max_tokens).status_code == 200
    # Without the reserve (the old budget, context - prompt - 2) the server refuses it.
    old = send(sim.url, 100, 4096 - 100 - 2)
    assert old.status_code == 400 and "Requested token count" in old.text
    # The smallest input the budget rejects is the one the server refuses.
    assert str(budget(4088, limits).reason).startswith("prompt_too_long")
    assert not str(budget(4087, limits).reason).startswith("prompt_too_long")
    assert send(sim.url, 4088, 1).status_code == 400
    assert send(sim.url, 4087, 1).status_code == 200


def test_without_an_engine_the_reserve_and_input_limit_come_from_flags(tmp_path: Path) -> None:
    limits = resolve_limits(settings(tmp_path, context_length=4096, reserved_tokens=8,
                                     max_req_input_len=3000))
    assert limits.reserved_tokens == 8
    assert budget(100, limits).max_tokens == 4096 - 8 - 100 - 1
    assert budget(3000, limits).rejected and not budget(2999, limits).rejected
    with pytest.raises(ConfigError, match="--reserved-tokens"):
        settings(tmp_path, context_length=4096, reserved_tokens=-1)


@pytest.mark.parametrize("order", [(4096, 8192), (8192, 4096)])
def test_several_servers_the_smallest_limits_win(start_sim: StartSim, tmp_path: Path,
                                                  order: tuple[int, int]) -> None:
    sims = [start_sim(context_length=c) for c in order]
    limits = resolve_limits(settings(tmp_path, *(s.url for s in sims)))
    assert limits.context_length == 4096
    assert limits.max_req_input_len == 4096 - 6  # max_req_len - 5 = (4096 - 1) - 5
    assert budget(100, limits).max_tokens == 4096 - 100 - 2


def test_the_largest_reserve_wins(start_sim: StartSim, tmp_path: Path) -> None:
    plain, eagle = start_sim(context_length=8192), start_sim(context_length=8192, **EAGLE)
    limits = resolve_limits(settings(tmp_path, plain.url, eagle.url))
    assert limits.reserved_tokens == 8
    assert budget(100, limits).max_tokens == 8192 - 8 - 100 - 1


def test_engine_urls_are_stored_in_the_manifest_and_a_resume_may_keep_them(
        tmp_path: Path) -> None:
    one = settings(tmp_path, "http://a:1", "http://b:2", context_length=4096)
    assert one.manifest_settings()["engine_url"] == ["http://a:1", "http://b:2"]
    assert one.manifest_settings()["reserved_tokens"] == 0
    # A single URL (the old spelling) is a tuple of one.
    old = ProducerSettings(input=one.input, run="r", redis_url="redis://x",
                           engine_url="http://a:1")  # type: ignore[arg-type]
    assert old.engine_url == ("http://a:1",)


def seed_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "--seed" in r.getMessage()]


def test_seed_warns_once_when_a_server_ignores_it(start_sim: StartSim, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    plain, plain2 = start_sim(), start_sim()
    deterministic = start_sim(enable_deterministic_inference=True)
    caplog.set_level(logging.WARNING)
    resolve_limits(settings(tmp_path, plain.url, plain2.url, deterministic.url,
                            sampling=Sampling(seed=5)))
    warnings = seed_warnings(caplog)
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert plain.url in warnings[0] and plain2.url in warnings[0]
    assert deterministic.url not in warnings[0]
    caplog.clear()
    resolve_limits(settings(tmp_path, deterministic.url, sampling=Sampling(seed=5)))
    resolve_limits(settings(tmp_path, plain.url))  # no --seed, nothing to say
    assert seed_warnings(caplog) == []


class CharTokenizer:
    """One token per character: a prompt of N characters is exactly N tokens."""

    name = "chars"

    def render(self, messages: object, template_kwargs: object = None) -> str:
        raise AssertionError("prompt rows are not rendered")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[PROBE] * len(t) for t in texts]

    def count(self, text: str) -> int:
        return len(text)


class DllmLikeServer(BaseHTTPRequestHandler):
    """A server whose reported `max_req_input_len` is below what the context implies (SGLang's
    tp_worker.py lowers it by the block size for diffusion LLMs)."""

    INFO: ClassVar[dict[str, int]] = {"context_length": 4096, "max_total_num_tokens": 100_000,
                                      "max_req_input_len": 3000}

    def do_GET(self) -> None:  # http.server calls it by this name
        body = {"/v1/models": {"data": [{"id": "m", "max_model_len": 4096}]},
                "/server_info": self.INFO}.get(self.path)
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(json.dumps(body or {}).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dllm_like() -> Iterator[str]:
    with serving(DllmLikeServer) as url:
        yield url


@pytest.mark.parametrize("server", ["speculative", "dllm-like"])
def test_a_prompt_at_the_servers_input_limit_is_rejected_before_sending(
        start_sim: StartSim, dllm_like: str, redis_url: str, tmp_path: Path,
        server: str) -> None:
    url = start_sim(context_length=4096, **EAGLE).url if server == "speculative" else dllm_like
    reported = httpx.get(url + "/server_info").json()["max_req_input_len"]
    # The server refuses `limit` tokens: its max_req_input_len, or context - reserve if smaller.
    limit = 4096 - 8 if server == "speculative" else reported
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "fits", "prompt": "x" * (limit - 10)}) + "\n"
                       + json.dumps({"id": "at_limit", "prompt": "x" * limit}) + "\n")
    s = ProducerSettings(input=prompts, run="at-limit", redis_url=redis_url, engine_url=(url,),
                         high_water=100, min_output_tokens=1)
    report = standalone_producer(s, tokenizer=CharTokenizer()).send_pass()
    assert (report.enqueued, report.rejected) == (1, 1)


def test_unreachable_engine_is_one_line_and_exit_4(tmp_path: Path, redis_url: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(EngineUnreachable):
        resolve_limits(settings(tmp_path, "http://127.0.0.1:9"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    code = main(["produce", str(prompts), "--run", "r", "--redis", redis_url,
                 "--engine-url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == exitcodes.UNAVAILABLE
    assert len(err.strip().splitlines()) == 1 and "http://127.0.0.1:9" in err, err


def test_a_server_without_a_context_is_one_line_and_exit_3(
        dllm_like: str, tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DllmLikeServer, "do_GET", _no_context)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    code = main(["produce", str(prompts), "--run", "r", "--redis", redis_url,
                 "--engine-url", dllm_like])
    err = capsys.readouterr().err
    assert code == exitcodes.CONFIG
    assert len(err.strip().splitlines()) == 1 and "context" in err, err


def _no_context(self: DllmLikeServer) -> None:
    self.send_response(200)
    self.end_headers()
    self.wfile.write(b'{"data": [{"id": "m"}]}' if self.path == "/v1/models" else b"{}")


def test_a_json_schema_on_a_thinking_prompt_needs_a_server_with_a_reasoning_parser(
        start_sim: StartSim, redis_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang lets a grammar wait for `</think>` only with --reasoning-parser
    (`create_grammar_backend`), which /server_info reports. Without one, a schema on a prompt
    that opened <think> would be written inside the reasoning: `produce` refuses before
    sending anything (exit 3, one line naming the fix), and a row's own schema when its row
    comes. A closed think block, or a server with a parser, runs."""
    parserless = start_sim(thinking=True, no_reasoning_parser=True, context_length=4096)
    parser = start_sim(thinking=True, context_length=4096)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"r{i}", "messages": [
        {"role": "user", "content": f"Question {i}?"}]}) + "\n" for i in range(3)))
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    client = redis.Redis.from_url(redis_url)

    def produce(run: str, url: str, *flags: str, source: Path = prompts) -> tuple[int, str]:
        code = main(["produce", str(source), "--run", run, "--redis", redis_url,
                     "--engine-url", url, "--no-wait", *flags])
        return code, capsys.readouterr().err

    code, err = produce("parserless", parserless.url, "--json-schema", str(schema))
    assert code == exitcodes.CONFIG, err
    assert len(err.strip().splitlines()) == 1 and "--reasoning-parser qwen3" in err, err
    assert parserless.url in err and "--json-schema on a thinking prompt" in err
    assert not client.exists(RunKeys("parserless").manifest), "refused before the run opened"

    assert produce("off", parserless.url, "--json-schema", str(schema),
                   "--chat-template-kwargs", '{"enable_thinking": false}')[0] == exitcodes.OK
    assert produce("parser", parser.url, "--json-schema", str(schema))[0] == exitcodes.OK
    assert produce("plain", parserless.url)[0] == exitcodes.OK

    own = tmp_path / "own.jsonl"
    own.write_text(prompts.read_text() + json.dumps({
        "id": "own", "json_schema": {"type": "object"},
        "messages": [{"role": "user", "content": "JSON?"}]}) + "\n")
    code, err = produce("own", parserless.url, source=own)
    assert code == exitcodes.CONFIG and "row 4's json_schema" in err, err
    assert len(err.strip().splitlines()) == 1 and "--reasoning-parser qwen3" in err


def test_which_servers_let_a_grammar_wait_for_the_reasoning() -> None:
    sglang, openai = PROTOCOLS["sglang"], PROTOCOLS["openai"]
    read = {"context_length": 4096, "max_req_input_len": 4090}
    with_parser = ServerLimits(**read, reasoning_parser="qwen3")  # type: ignore[arg-type]
    without = ServerLimits(**read)  # type: ignore[arg-type]
    assert grammar_cannot_wait(sglang, {"u": with_parser}) is None
    assert "--reasoning-parser qwen3" in str(grammar_cannot_wait(sglang, {"a": with_parser,
                                                                          "u": without}))
    # SGLang's /v1/completions has no require_reasoning, parser or not
    assert "FLEETGEN_ENGINE_PROTOCOL=sglang" in str(grammar_cannot_wait(openai,
                                                                        {"u": with_parser}))
    # no server info read (no max_req_input_len), vLLM (its parser unreported): not refused
    assert grammar_cannot_wait(sglang, {"u": ServerLimits(context_length=4096)}) is None
    assert grammar_cannot_wait(openai, {"u": ServerLimits(context_length=4096,
                                                          engine="vllm")}) is None
