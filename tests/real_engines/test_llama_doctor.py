"""`fleetgen doctor`'s chat-template check against a real llama-server (llama.cpp) serving the
tiny Qwen3.6-vocabulary model with Qwen3.6's official template (`--chat-template-file`).

What it found: llama.cpp's Jinja engine renders the official template as transformers does,
except that llama-server passes `preserve_reasoning: true` to every template by default
(`--reasoning-preserve`, "default: enabled"), which keeps an earlier turn's reasoning; with
`--no-reasoning-preserve` every probe agrees token for token. Without a template of its own
(the GGUF carries none) it falls back to ChatML, and doctor fails on every probe."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetgen import exitcodes
from fleetgen.cli.doctor import DISAGREES
from fleetgen.cli.main import main
from producer.qwen_build import QWEN_TEMPLATE_FILE
from tests.support.llama import LlamaServer

OFFICIAL = ["--jinja", "--chat-template-file", str(QWEN_TEMPLATE_FILE)]
HISTORY = "system + history with reasoning_content"
StartLlama = Callable[..., LlamaServer]


@pytest.fixture
def start_llama(llama_binary: Path, llama_model: Path,
                tmp_path: Path) -> Iterator[StartLlama]:
    servers: list[LlamaServer] = []

    def start(*flags: str) -> LlamaServer:
        server = LlamaServer(llama_binary, llama_model, tmp_path / f"llama-{len(servers)}.log",
                             args=["-c", "4096", "-np", "1", *flags])
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


def doctor_lines(capsys: pytest.CaptureFixture[str], url: str) -> tuple[int, dict[str, str]]:
    code = main(["doctor", "--engine-url", url])
    out = capsys.readouterr().out
    prefix = f" {url} chat template, "
    lines = {line.partition(prefix)[2].partition(": ")[0]: line
             for line in out.splitlines() if prefix in line}
    assert len(lines) == 3, out
    return code, lines


def test_the_official_template_without_reasoning_preserve_agrees(
        start_llama: StartLlama, capsys: pytest.CaptureFixture[str]) -> None:
    server = start_llama(*OFFICIAL, "--no-reasoning-preserve")
    code, lines = doctor_lines(capsys, server.url)
    assert code == exitcodes.OK, lines
    for line in lines.values():
        assert line.startswith("ok ") and "the same tokens (/apply-template, /tokenize)" in line


def test_llama_cpp_keeps_history_reasoning_by_default(
        start_llama: StartLlama, capsys: pytest.CaptureFixture[str]) -> None:
    server = start_llama(*OFFICIAL)
    code, lines = doctor_lines(capsys, server.url)
    assert code == DISAGREES, lines
    assert lines["one user turn"].startswith("ok ")
    assert lines["one user turn, enable_thinking false"].startswith("ok ")
    history = lines[HISTORY]
    assert "server 66 tokens, fleetgen (qwen3.6) 46" in history, history
    assert "first difference at token 24: server '<think>\\nPrimes: '" in history, history
    assert "--no-reasoning-preserve" in history


def test_llama_cpp_without_the_template_is_chatml_and_fails(
        start_llama: StartLlama, capsys: pytest.CaptureFixture[str]) -> None:
    server = start_llama()
    code, lines = doctor_lines(capsys, server.url)
    assert code == DISAGREES, lines
    assert "server 15 tokens, fleetgen (qwen3.6) 17" in lines["one user turn"]
    assert "first difference at token 15: server <end of prompt>, fleetgen '<think>\\n'" \
        in lines["one user turn"]
