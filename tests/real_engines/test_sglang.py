"""The real SGLang 0.5.23 server on this CPU (tests/support/sglang.py), one per module: every
test of the tier is here, so `--dist loadscope` runs them in one process beside one server.

On it, as a user runs them: `fleetgen doctor`; `fleetgen run --engine-url` with a relative
--out, rows at the budget's edge (SGLang's own silent cut two tokens short of the context,
probed on the same server) and its limit paced below a slot count sized from the token pool;
and the README's `fleetgen run --engine-cmd 'python -m sglang.launch_server ... --port
{port}'` typed with the shell's variables the CPU engine needs, leaving no process behind.
What the real server was seen to do: docs/engines.md."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from fleetgen import exitcodes
from tests.support.binaries import require_binary
from tests.support.cli import fleetgen_cli
from tests.support.pipeline import assert_exactly_once, make_prompts, row_of, write_jsonl
from tests.support.sglang import (
    CONTEXT,
    ENGINE_ENV,
    INPUT_LIMIT,
    SGLANG_STAMP,
    SglangServer,
    launch_args,
    sglang_python,
)
from tests.support.survivors import marked, new_mark
from tests.support.vllm import tiny_vllm_model
from workers.pacing import START_LIMIT

# The server's start (20-50 s on quiet cores, minutes on loaded ones), twice.
pytestmark = pytest.mark.timeout(1500)
CAP = 32  # the budget of the length-rule probes
MIN_OUTPUT = 16  # fleetgen's default --min-output-tokens


@pytest.fixture(scope="module")
def python() -> Path:
    return Path(require_binary(
        "python", str(sglang_python() or SGLANG_STAMP),
        why="the SGLang tier's venv: `make sglang` installs SGLang 0.5.23 for this CPU into "
            ".venv/sglang (~2-4 min once)"))


@pytest.fixture(scope="module")
def model(python: Path) -> Path:
    return tiny_vllm_model(python)


@pytest.fixture(scope="module")
def sglang(python: Path, model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[SglangServer]:
    log = tmp_path_factory.mktemp("sglang") / "sglang.log"
    server = SglangServer(python, model, log).start()
    try:
        yield server
    finally:
        server.stop()


def edge_prompts(path: Path) -> set[str]:
    """Rows near the context, so that the default budget (all the context leaves, no cap) is
    short on this CPU: leaving exactly --min-output-tokens' 16, 15 (rejected), the input
    limit's last token (5 left: rejected), the input limit itself (rejected), and three that
    leave tens of tokens."""
    rows = [row_of(CONTEXT - 2 - MIN_OUTPUT, "room-16"), row_of(CONTEXT - 2 - 15, "room-15"),
            row_of(INPUT_LIMIT - 1, "limit-less-1"), row_of(INPUT_LIMIT, "at-input-limit")]
    rows += [row_of(CONTEXT - room, f"room-{room}") for room in (40, 70, 100)]
    write_jsonl(path, rows)
    return {row["id"] for row in rows}


def test_the_servers_own_length_rules_are_fleetgens(sglang: SglangServer) -> None:
    """On the server itself: input + new = context is taken and cut two short, silently
    (finish `length` at 30 of 32); one more is a 400; so the largest budget that comes back
    whole is context - input - 2, fleetgen's rule (fleetgen/engine/sglang.py)."""
    def generate(n: int, new: int) -> httpx.Response:
        return httpx.post(f"{sglang.url}/generate", timeout=300, json={
            "input_ids": [100] * n, "sampling_params": {"max_new_tokens": new,
                                                        "ignore_eos": True}})

    on_context = generate(CONTEXT - CAP, CAP)
    assert on_context.status_code == 200
    assert on_context.json()["meta_info"]["completion_tokens"] == CAP - 2
    past = generate(CONTEXT - CAP, CAP + 1)
    assert past.status_code == 400 and "maximum context length" in past.text
    whole = generate(CONTEXT - CAP, CAP - 2)
    assert whole.json()["meta_info"]["completion_tokens"] == CAP - 2
    assert generate(INPUT_LIMIT, 1).status_code == 400


def test_doctor_then_run_at_the_budgets_edge(sglang: SglangServer, tmp_path: Path) -> None:
    doctor = subprocess.run(fleetgen_cli("doctor", "--engine-url", sglang.url), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert doctor.returncode == exitcodes.OK, doctor.stdout + doctor.stderr
    assert f"refuses a {INPUT_LIMIT}-token input" in doctor.stdout, doctor.stdout
    prompts = tmp_path / "p.jsonl"
    expected = edge_prompts(prompts)
    # The defaults (no cap: each answer may use all the context leaves), but --token-ids, so
    # the ids can be counted against the budget.
    done = subprocess.run(fleetgen_cli("run", prompts.name, "--engine-url", sglang.url,
                                       "--out", "out/s", "--token-ids"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = assert_exactly_once(tmp_path / "out" / "s", expected)
    assert sorted(r["id"] for r in data["rejected"]) == ["at-input-limit", "limit-less-1",
                                                         "room-15"]
    assert not data["failures"]
    for r in data["results"]:
        budget = CONTEXT - r["prompt_tokens"] - 2  # the rule the test above found
        assert r["max_tokens"] == budget, r["id"]
        # Never a silent cut: the random model ends at its budget, exactly, or at a stop.
        assert (r["finish_reason"] == "length" and r["completion_tokens"] == budget) or \
            (r["finish_reason"] == "stop" and r["completion_tokens"] <= budget), r
        assert len(r["output_ids"]) == r["completion_tokens"]
    assert {r["id"]: r["max_tokens"] for r in data["results"]}["room-16"] == MIN_OUTPUT
    # 4,096 reported slots (sized from the token pool on this CPU) are a ceiling: the worker
    # starts at START_LIMIT and paces, where it held K + 1 = 4097 and sent the run at once.
    assert f"limit {START_LIMIT}" in done.stdout + done.stderr, done.stdout[-2000:]
    assert "reports 4096 running requests" in done.stdout + done.stderr


def test_the_readme_engine_cmd_with_the_shells_variables(python: Path, model: Path,
                                                          tmp_path: Path) -> None:
    """`fleetgen run --engine-cmd` typed as a shell line (`NAME=value python -m
    sglang.launch_server ... --port {port}`): before, exit 3, "program
    'SGLANG_USE_CPU_ENGINE=1' is not on PATH". The run completing shows the variable reached
    the server: without it this SGLang's scheduler dies at its start (seen here:
    `ModuleNotFoundError: No module named 'vllm'`, its rotary kernel). No SGLang, worker or
    Valkey process is left."""
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 6, seed=5)
    expected = {orjson.loads(line)["id"] for line in prompts.read_bytes().splitlines()}
    variables = " ".join(f"{name}={value}" for name, value in ENGINE_ENV.items())
    line = f"{variables} {shlex.quote(str(python))} {shlex.join(launch_args(model, '{port}'))}"
    mark = new_mark()
    # No GPU here: CUDA_VISIBLE_DEVICES=0 and --gpus 0 give the one engine its group. The cap
    # keeps the varied rows' answers (otherwise ~3,500 tokens each) to seconds on one core.
    done = subprocess.run(
        fleetgen_cli("run", prompts.name, "--engine-cmd", line, "--gpus", "0", "--out", "out",
                     "--max-output-tokens", "16"),
        cwd=tmp_path, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0", **mark})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = assert_exactly_once(tmp_path / "out", expected)
    assert len(data["results"]) == 6
    assert marked(mark) == [], marked(mark)
