"""`fleetgen doctor` against simulated SGLang servers in each of their modes, over real HTTP:
the values it prints, its verdict and its exit code."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from fleetgen import exitcodes
from fleetgen.cli.doctor import COLUMNS, DISAGREES
from fleetgen.cli.main import main
from fleetgen.simulator import SimConfig, SimThread, run_in_thread
from tests.support.httpd import serving

StartSim = Callable[..., SimThread]
EAGLE = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 4,
         "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6}


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    handles: list[SimThread] = []

    def start(**overrides: object) -> SimThread:
        settings: dict[str, object] = {"port": 0, "ttft_ms": 0.0, "tpot_ms": 0.0,
                                       "health_delay_s": 0.0, "context_length": 4096}
        settings.update(overrides)
        handles.append(run_in_thread(SimConfig(**settings)))  # type: ignore[arg-type]
        return handles[-1]

    yield start
    for handle in handles:
        handle.stop()


def doctor(capsys: pytest.CaptureFixture[str], *urls: str, json_out: bool = False,
           ) -> tuple[int, str]:
    argv = ["doctor", *(a for u in urls for a in ("--engine-url", u))]
    code = main([*argv, "--json"] if json_out else argv)
    return code, capsys.readouterr().out


def row(out: str, url: str) -> dict[str, str]:
    """The table row of `url`, by column name."""
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0] == url:
            names = ["server", "model", "context", "input", "reserve", "running", "-c",
                     "deterministic", "text"]
            assert len(names) == len(COLUMNS)
            return dict(zip(names, cells, strict=True))
    raise AssertionError(f"no row for {url} in:\n{out}")


MODES: list[tuple[str, dict[str, Any], int, dict[str, str], list[str]]] = [
    ("plain", {}, exitcodes.OK,
     {"context": "4096", "input": "4090", "reserve": "0", "running": "64", "-c": "65",
      "deterministic": "no", "text": "yes"},
     ["refuses a 4090-token input: 400 Input length (4090 tokens)", "verdict: ok",
      "note: --seed is not honoured"]),
    ("derived-slots", {"derived_slots": 24}, exitcodes.OK,
     {"running": "24", "-c": "25"}, ["verdict: ok"]),
    ("speculative", EAGLE, exitcodes.OK,
     {"input": "4088", "reserve": "8", "running": "48", "-c": "49"},
     ["refuses a 4088-token input: 400 The input (4096 tokens) is longer than the model's "
      "context length", "context 4096, reserve 8 as reported", "verdict: ok"]),
    ("deterministic", {"enable_deterministic_inference": True}, exitcodes.OK,
     {"deterministic": "yes"}, ["verdict: ok"]),
    ("skip-tokenizer-init", {"skip_tokenizer_init": True}, DISAGREES,
     {"text": "no"}, ["FAIL", "--skip-tokenizer-init", "verdict: FAIL"]),
    ("auto-truncate", {"allow_auto_truncate": True}, DISAGREES,
     {"input": "4090"}, ["FAIL", "refuses a 4090-token input: accepted it",
                         "--allow-auto-truncate", "verdict: FAIL"]),
]


@pytest.mark.parametrize(("mode", "overrides", "code", "values", "lines"), MODES,
                         ids=[m[0] for m in MODES])
def test_doctor_in_each_simulator_mode(start_sim: StartSim, capsys: pytest.CaptureFixture[str],
                                       mode: str, overrides: dict[str, Any], code: int,
                                       values: dict[str, str], lines: list[str]) -> None:
    sim = start_sim(**overrides)
    got, out = doctor(capsys, sim.url)
    assert got == code, out
    printed = row(out, sim.url)
    assert {k: printed[k] for k in values} == values, out
    assert printed["model"] == "fleetgen-sim" and printed["context"] == "4096"
    for needle in lines:
        assert needle in out, out
    if overrides.get("enable_deterministic_inference"):
        assert "--seed is not honoured" not in out


def test_two_servers_with_different_contexts_disagree(start_sim: StartSim,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    small, large = start_sim(context_length=4096), start_sim(context_length=8192)
    code, out = doctor(capsys, small.url, large.url)
    assert code == DISAGREES, out
    assert row(out, small.url)["context"] == "4096" and row(out, large.url)["context"] == "8192"
    assert "the producer budgets for: context 4096, input limit 4090, reserve 0" in out
    assert f"FAIL servers' context: they disagree: 4096 ({small.url}), 8192 ({large.url})" \
        in out


def test_an_unreachable_server_is_one_line_and_exit_4(start_sim: StartSim,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim()
    dead = "http://127.0.0.1:9"
    code, out = doctor(capsys, sim.url, dead)
    assert code == exitcodes.UNAVAILABLE, out
    about_dead = [line for line in out.splitlines()
                  if dead in line and not line.startswith(dead)]
    assert len(about_dead) == 1 and about_dead[0].startswith("FAIL"), out
    assert row(out, sim.url)["context"] == "4096"  # the reachable one is still reported


def test_json_output(start_sim: StartSim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim(**EAGLE)
    code, out = doctor(capsys, sim.url, json_out=True)
    doc = json.loads(out)
    assert code == doc["exit_code"] == exitcodes.OK
    server = doc["servers"][0]
    assert server["limits"]["reserved_tokens"] == 8 and server["input_limit"] == 4088
    assert server["concurrency"] == 49 and all(c["ok"] for c in server["checks"])
    assert doc["assumed"]["context_length"] == 4096


class NoContext(BaseHTTPRequestHandler):
    """A server that answers but reports no context length anywhere."""

    def do_GET(self) -> None:  # http.server calls it by this name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "m"}]}' if self.path == "/v1/models" else b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_without_a_context_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(NoContext) as url:
        code, out = doctor(capsys, url)
    assert code == exitcodes.CONFIG, out
    assert "reports no context length" in out


def test_check_uses_the_instant_readiness_probe(start_sim: StartSim, redis_url: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang's /health generates a token and takes >= 1 s; `check` must not wait on it."""
    sim = start_sim(health_delay_s=30.0)
    code = main(["check", "--redis", redis_url, "--engine-url", sim.url, "--timeout-s", "2"])
    out = capsys.readouterr().out
    assert code == exitcodes.OK, out
    assert f"ok   engine: {sim.url}/ready 200" in out


# -- the chat-template check ------------------------------------------------------------------
# Qwen2.5's ChatML shape: a default system prompt when the chat has none, no think block.
CHATML = (
    "{%- if messages[0].role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PROBE_NAMES = ("one user turn", "one user turn, enable_thinking false",
               "system + history with reasoning_content")


def template_lines(out: str, url: str) -> dict[str, str]:
    """The chat-template check lines of `url`, by probe name."""
    prefix = f" {url} chat template, "
    found = {}
    for line in out.splitlines():
        if prefix in line:
            probe, _, detail = line.partition(prefix)[2].partition(": ")
            found[probe] = f"{line[:4].strip()} {detail}"
    assert sorted(found) == sorted(PROBE_NAMES), out
    return found


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_the_official_template_agrees_token_for_token(start_sim: StartSim, flavor: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim(flavor=flavor)
    code, out = doctor(capsys, sim.url)
    assert code == exitcodes.OK, out
    lines = template_lines(out, sim.url)
    via = "/v1/chat/completions usage.prompt_tokens, /tokenize" if flavor == "sglang" \
        else "/tokenize"
    # <|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n<think>\n: 17 tokens; the empty
    # think block of enable_thinking false is 2 more; the history drops its old reasoning.
    for probe, tokens in zip(PROBE_NAMES, (17, 19, 46), strict=True):
        assert lines[probe] == (f"ok server {tokens} tokens, fleetgen (qwen3.6) {tokens}: the "
                                f"same tokens ({via})"), out
    assert "verdict: ok" in out


@pytest.mark.parametrize("flavor", ["sglang", "vllm"])
def test_a_different_template_fails_with_the_first_differing_token(
        start_sim: StartSim, flavor: str, tmp_path: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    sim = start_sim(flavor=flavor, chat_template=str(template))
    code, out = doctor(capsys, sim.url)
    assert code == DISAGREES, out
    lines = template_lines(out, sim.url)
    # The default system prompt comes first where ours has the user turn (token 1: 'system'
    # 8678 against 'user' 846), and ChatML has no think block.
    one = lines["one user turn"]
    assert one.startswith("FAIL server 26 tokens, fleetgen (qwen3.6) 17"), out
    assert "first difference at token 1: server 'system\\nYou are a helpful' " \
           "[8678, 198, 2523, 513, 264, 10631], fleetgen 'user\\nWhat is the capital' " \
           "[846, 198, 3710, 369, 279, 6511]" in one, out
    assert lines["one user turn, enable_thinking false"].startswith(
        "FAIL server 26 tokens, fleetgen (qwen3.6) 19"), out
    history = lines["system + history with reasoning_content"]
    assert history.startswith("FAIL server 44 tokens, fleetgen (qwen3.6) 46"), out
    assert "first difference at token 44: server <end of prompt>, fleetgen '<think>\\n' " \
           "[248068, 198]" in history, out
    assert "verdict: FAIL" in out

    code, out = doctor(capsys, sim.url, json_out=True)
    server = json.loads(out)["servers"][0]
    assert code == server["exit_code"] == DISAGREES
    first = server["template"][0]
    assert (first["server_tokens"], first["fleetgen_tokens"], first["agree"]) == (26, 17, False)
    assert first["first_difference"]["position"] == 1
    assert first["first_difference"]["server"][0] == 8678
    assert first["first_difference"]["fleetgen"][0] == 846


def test_the_runs_template_kwargs_reach_both_sides(start_sim: StartSim,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """With the run's enable_thinking false every probe ends in the empty think block, on the
    server (chat_template_kwargs) as in fleetgen; a server not sent them would count 2 less."""
    sim = start_sim()
    code = main(["doctor", "--engine-url", sim.url, "--chat-template-kwargs",
                 '{"enable_thinking": false}'])
    out = capsys.readouterr().out
    assert code == exitcodes.OK, out
    lines = template_lines(out, sim.url)
    assert lines["one user turn"].startswith("ok server 19 tokens, fleetgen (qwen3.6) 19"), out
    assert lines["system + history with reasoning_content"].startswith(
        "ok server 48 tokens, fleetgen (qwen3.6) 48"), out


def test_bad_template_kwargs_are_one_line_and_exit_3(start_sim: StartSim,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim()
    code = main(["doctor", "--engine-url", sim.url, "--chat-template-kwargs", "[1]"])
    captured = capsys.readouterr()
    assert code == exitcodes.CONFIG, captured
    assert "--chat-template-kwargs must be a JSON object" in captured.err + captured.out


@pytest.mark.parametrize(("thinking", "note"), [
    (True, "reasoning parser qwen3: a JSON schema's grammar can wait for </think>"),
    (False, "no reasoning parser: a JSON schema's grammar holds from the first token"),
])
def test_doctor_reports_the_reasoning_parser(start_sim: StartSim, thinking: bool, note: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim(thinking=thinking)
    code, out = doctor(capsys, sim.url)
    assert code == exitcodes.OK, out
    assert f"note: {sim.url} {note}" in out
    code, out = doctor(capsys, sim.url, json_out=True)
    assert json.loads(out)["servers"][0]["limits"]["reasoning_parser"] == \
        ("qwen3" if thinking else None)


def test_doctor_says_vllm_does_not_report_its_reasoning_parser(
        start_sim: StartSim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim(flavor="vllm", thinking=True)
    code, out = doctor(capsys, sim.url)
    assert code == exitcodes.OK, out
    assert f"note: {sim.url} reasoning parser unknown (vLLM's /v1/models does not say)" in out


@pytest.mark.parametrize("level", ["none", "summary"])
def test_doctor_tells_to_start_vllm_with_per_request_acceptance(
        start_sim: StartSim, capsys: pytest.CaptureFixture[str], level: str) -> None:
    """A speculating vLLM without --per-request-spec-decode-metrics: a note naming the flag,
    exit 0 (the counters still give one figure per server); with it, an ok line."""
    sim = start_sim(flavor="vllm", speculative_algorithm="NGRAM",
                    per_request_spec_decode_metrics=level)
    code, out = doctor(capsys, sim.url)
    assert code == exitcodes.OK, out
    line = next(x for x in out.splitlines() if " acceptance: " in x)
    if level == "none":
        assert line.startswith(f"note {sim.url} acceptance:"), out
        assert "--per-request-spec-decode-metrics summary" in line
    else:
        assert line.startswith(f"ok   {sim.url} acceptance: each answer carries its own"), out


class WithoutTokenize(BaseHTTPRequestHandler):
    """An SGLang server older than /tokenize: the simulator behind a proxy that answers 404
    there and passes everything else on."""

    upstream = ""

    def _forward(self, method: str) -> None:
        if self.path in ("/tokenize", "/v1/tokenize"):
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b'{"detail": "Not Found"}')
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = httpx.request(method, self.upstream + self.path, content=body or None,
                               headers={"Content-Type": "application/json"}, timeout=30)
        self.send_response(answer.status_code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.content)

    def do_GET(self) -> None:
        self._forward("GET")

    def do_POST(self) -> None:
        self._forward("POST")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("template", "code"), [(None, exitcodes.OK), (CHATML, DISAGREES)])
def test_without_tokenize_sglang_is_compared_by_count(
        start_sim: StartSim, tmp_path: Any, capsys: pytest.CaptureFixture[str],
        template: str | None, code: int) -> None:
    path = None
    if template is not None:
        path = tmp_path / "chatml.jinja"
        path.write_text(template)
    sim = start_sim(chat_template=None if path is None else str(path))
    handler = type("Proxy", (WithoutTokenize,), {"upstream": sim.url})
    with serving(handler) as url:
        got, out = doctor(capsys, url)
    assert got == code, out
    one = template_lines(out, url)["one user turn"]
    via = "(/v1/chat/completions usage.prompt_tokens (no /tokenize: counts only))"
    if template is None:
        assert one == f"ok server 17 tokens, fleetgen (qwen3.6) 17: the same count {via}", out
    else:
        assert one.startswith(f"FAIL server 26 tokens, fleetgen (qwen3.6) 17 {via}; the "
                              "server renders chats differently"), out
        assert "first difference" not in one


NO_SYSTEM = (
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}{{- raise_exception('System role not supported') }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


def test_a_probe_the_server_cannot_render_is_a_failure(
        start_sim: StartSim, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    template = tmp_path / "no-system.jinja"
    template.write_text(NO_SYSTEM)
    sim = start_sim(chat_template=str(template))
    code, out = doctor(capsys, sim.url)
    assert code == DISAGREES, out
    assert template_lines(out, sim.url)["system + history with reasoning_content"] == (
        "FAIL not compared: the server could not render it: /v1/chat/completions: 400 System "
        "role not supported"), out


def test_a_tokenizer_directory_of_ones_own(start_sim: StartSim, tmp_path: Any,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """--tokenizer DIR renders with that directory's template: one that refuses the system
    turn leaves that probe uncompared, and its other renderings disagree with the server's."""
    from producer.tokenizer import load_tokenizer

    hf = load_tokenizer("qwen3.6").hf
    own = tmp_path / "tokenizer"
    hf.save_pretrained(str(own))
    (own / "chat_template.jinja").write_text(NO_SYSTEM)
    sim = start_sim()
    code = main(["doctor", "--engine-url", sim.url, "--tokenizer", str(own)])
    out = capsys.readouterr().out
    assert code == DISAGREES, out
    lines = template_lines(out, sim.url)
    assert lines["system + history with reasoning_content"] == (
        "FAIL not compared: fleetgen's template refused it: chat template refused the row: "
        "System role not supported"), out
    # Ours has no empty think block for enable_thinking false: 17 against the server's 19.
    assert lines["one user turn"].startswith(f"ok server 17 tokens, fleetgen ({own}) 17"), out
    assert lines["one user turn, enable_thinking false"].startswith(
        f"FAIL server 19 tokens, fleetgen ({own}) 17"), out


# ------------------------------------------------------------ llama.cpp and `__verbose`

LLAMA = {"flavor": "llama", "model_name": "qwen3.6"}


def verbose_line(out: str, url: str) -> str:
    lines = [line for line in out.splitlines() if f"{url} __verbose: " in line]
    assert len(lines) == 1, out
    return lines[0]


def test_a_llama_server_with_verbose_passes_for_token_ids_and_stop_words(
        start_sim: StartSim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim(**LLAMA)
    code = main(["doctor", "--engine-url", sim.url, "--token-ids", "--stop", "END"])
    out = capsys.readouterr().out
    assert code == exitcodes.OK, out
    assert verbose_line(out, sim.url).startswith("ok ")


def test_a_llama_build_without_verbose_is_refused_when_the_run_needs_it(
        start_sim: StartSim, capsys: pytest.CaptureFixture[str]) -> None:
    """A llama.cpp server older than b9754 answers `"verbose": true` without `__verbose`, the
    only place of its token ids and stop word: doctor names the build that has it, in one
    line; without --token-ids or --stop it is a note. (Before: no such check, exit 0.)"""
    sim = start_sim(**LLAMA, llama_verbose=False)
    code = main(["doctor", "--engine-url", sim.url, "--token-ids", "--stop", "END"])
    line = verbose_line(capsys.readouterr().out, sim.url)
    assert code == DISAGREES
    assert line.startswith("FAIL ") and "--token-ids and --stop need it" in line
    assert "llama.cpp b9754 or later" in line and "--verbose" in line
    code = main(["doctor", "--engine-url", sim.url])
    line = verbose_line(capsys.readouterr().out, sim.url)
    assert code == exitcodes.OK and line.startswith("ok ")
    assert "a run can use neither --token-ids nor --stop" in line


def test_run_refuses_such_a_llama_server_before_it_starts(
        start_sim: StartSim, capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    sim = start_sim(**LLAMA, llama_verbose=False)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    code = main(["run", str(prompts), "--engine-url", sim.url, "--out", str(tmp_path / "out"),
                 "--stop", "END"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == exitcodes.CONFIG
    assert len(err) == 1 and "--stop needs it" in err[0] and "b9754" in err[0], err
    assert not (tmp_path / "out" / "results.jsonl").exists()
