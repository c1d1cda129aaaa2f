"""`fleetgen run` against a real llama-server (llama.cpp, the tiny Qwen3.6-vocabulary model): the
pre-flight takes a server with Qwen3.6's official template and refuses one without it in one
line before anything starts; the run writes every row once through the server's OpenAI API."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from fleetgen import exitcodes
from producer.qwen_build import QWEN_TEMPLATE_FILE
from tests.support.cli import fleetgen_cli
from tests.support.llama import LlamaServer
from tests.support.pipeline import assert_exactly_once, make_prompts

# As test_llama_doctor found it: the official template, without llama-server's default
# `--reasoning-preserve`, renders every probe as transformers does.
OFFICIAL = ["--jinja", "--chat-template-file", str(QWEN_TEMPLATE_FILE),
            "--no-reasoning-preserve"]


@pytest.fixture
def llama_server(llama_binary: Path, llama_model: Path,
                 tmp_path: Path) -> Iterator[list[LlamaServer]]:
    servers: list[LlamaServer] = []
    yield servers
    for server in servers:
        server.stop()


def start(servers: list[LlamaServer], binary: Path, model: Path, log: Path,
          *flags: str) -> LlamaServer:
    server = LlamaServer(binary, model, log, args=["-c", "8192", "-np", "2", *flags])
    servers.append(server.start())
    return server


def fleetgen_run(tmp_path: Path, url: str, prompts: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(fleetgen_cli("run", str(prompts), "--engine-url", url, "--out",
                                       "out/llama", "--max-output-tokens", "24"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)


def test_run_on_a_real_llama_server(llama_server: list[LlamaServer], llama_binary: Path,
                                    llama_model: Path, tmp_path: Path) -> None:
    server = start(llama_server, llama_binary, llama_model, tmp_path / "llama.log", *OFFICIAL)
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, 12)
    done = fleetgen_run(tmp_path, server.url, prompts)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = assert_exactly_once(tmp_path / "out" / "llama", set(kinds["good"]))
    assert len(data["results"]) == 12 and not data["failures"]
    # Every answer came from the server, within the budget the run gave it.
    assert all(0 < r["completion_tokens"] <= r["max_tokens"] <= 24 for r in data["results"])
    assert "  complete                   yes" in done.stdout


def test_run_refuses_a_server_whose_template_disagrees(
        llama_server: list[LlamaServer], llama_binary: Path, llama_model: Path,
        tmp_path: Path) -> None:
    # No template of its own: llama-server falls back to ChatML, which is not Qwen3.6's.
    server = start(llama_server, llama_binary, llama_model, tmp_path / "llama.log")
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 4)
    done = fleetgen_run(tmp_path, server.url, prompts)
    assert done.returncode == exitcodes.CONFIG, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("fleetgen run:")]
    assert len(said) == 1 and "chat template" in said[0], done.stderr
    assert "Traceback" not in done.stderr
    assert "starting run" not in done.stdout
    assert not (tmp_path / "out" / "llama" / ".fleetgen-state").exists()


def test_bench_real_smoke_on_llama_cpp_holds_its_slots_from_the_start(
        llama_server: list[LlamaServer], llama_binary: Path, llama_model: Path,
        tmp_path: Path) -> None:
    """`python -m bench real --engine llama` in small: llama.cpp reports its slots (/props
    `total_slots`), so `fleetgen run` holds K + 1 from its first request and says where K came
    from. No bound on its time against the plain client's: at this size, on a loaded machine
    (fresh-clone make test: 24.6 s against 9.9 s), fleetgen's own processes compete with the
    unpinned server for the cores; the bench, pinned, gives the ratio (docs/performance.md)."""
    from bench.real import fleetgen as bench_fleetgen
    from bench.real import plain, write_rows

    slots = 4
    server = LlamaServer(llama_binary, llama_model, tmp_path / "llama.log",
                         args=["-c", str(slots * 1024), "-np", str(slots), *OFFICIAL])
    llama_server.append(server.start())
    # ~8 s of answers on a quiet machine: the terminal names the limit once it has held over
    # two of its looks (fleetgen/cli/runview.py, 2 s apart); a 2 s run ends before.
    rows, ids = tmp_path / "rows.jsonl", tmp_path / "ids.json"
    ids.write_bytes(orjson.dumps(write_rows(rows, 60)))
    baseline = plain(server.url, ids, slots, 48)
    run = bench_fleetgen(server.url, rows, 1, 48, tmp_path)
    assert run.tokens == baseline.tokens == 60 * 48  # the random model never stops
    assert max(run.series) == slots + 1, run.series
    assert f"llama.cpp reports {slots} running requests (/props total_slots): K + 1 = " \
        f"{slots + 1}" in (run.limit_line or ""), run.limit_line
