"""llama.cpp's llama-server as an engine fleetgen starts itself (`fleetgen run --engine-cmd`,
the tiny Qwen3.6-vocabulary model): SIGKILLed mid-run, it is started again on its URL, every
row is written once, and no llama-server is left at the end. Prints the restart time (kill to
serving again) that docs/cluster.md quotes."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

from fleetgen import exitcodes
from fleetgen.engine.health import probe_url
from producer.qwen_build import QWEN_TEMPLATE_FILE
from tests.support.cli import fleetgen_cli
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.survivors import marked, new_mark
from tests.support.waiting import wait_until

ROWS = 48
# Its workers call a server gone after 3 s, not 10: the restart is what is measured.
QUICK_WORKERS = {"FLEETGEN_HEALTH_INTERVAL_S": "1", "FLEETGEN_ENGINE_GONE_S": "3"}


def engine_cmd(binary: Path, model: Path) -> str:
    # Two slots of 4096 tokens, and Qwen3.6's official template, which the pre-flight wants
    # (tests/real_engines/test_llama_run.py).
    return shlex.join([str(binary), "-m", str(model), "-c", "8192", "-np", "2", "--host",
                       "127.0.0.1", "--jinja", "--chat-template-file", str(QWEN_TEMPLATE_FILE),
                       "--no-reasoning-preserve", "--port", "{port}"])


def written(out: Path) -> int:
    path = out / "results.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def servers(mark: dict[str, str]) -> list[int]:
    """The pids of the llama-servers the run started (they carry its mark; `fleetgen run`
    itself names one in its command line)."""
    return [int(pid) for pid, program, *_ in (entry.split() for entry in marked(mark))
            if program.endswith("/llama-server")]


def test_a_sigkilled_llama_server_comes_back_and_every_row_is_written_once(
        llama_binary: Path, llama_model: Path, tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"  # this test's own path: its cmdline names this run alone
    model.symlink_to(llama_model)
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, ROWS, seed=50)
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    mark = new_mark()
    env = {**os.environ, **mark, **QUICK_WORKERS, "CUDA_VISIBLE_DEVICES": "0"}
    with log.open("wb") as sink:
        run = subprocess.Popen(
            fleetgen_cli("run", prompts.name, "--engine-cmd", engine_cmd(llama_binary, model),
                         "--gpus", "0", "--out", "out", "--max-output-tokens", "24"),
            cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)

    def still_running() -> None:
        assert run.poll() is None, log.read_text(errors="replace")[-4000:]

    try:
        wait_until(lambda: written(out) >= 6, 300, "the first rows written", poll_s=0.1,
                   check=still_running)
        url = re.findall(r"engine0 \((http://127\.0\.0\.1:\d+)\) ready after",
                         log.read_text())[0]
        (pid,) = servers(mark)
        at_kill = written(out)
        load = os.getloadavg()[0]
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: servers(mark) not in ([], [pid]) and probe_url(url).ready, 120,
                   "llama-server serving again", poll_s=0.05, check=still_running)
        restart_s = time.monotonic() - killed_at
        assert run.wait(600) == exitcodes.OK, log.read_text(errors="replace")[-4000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = log.read_text(errors="replace")
    assert at_kill < ROWS, "the run was over before the kill"
    assert f"engine0 ({url}) exited with code -9; restarting in 1 s" in text, text[-3000:]
    assert len(re.findall(rf"engine0 \({url}\) ready after", text)) == 2, text[-3000:]
    data = assert_exactly_once(out, set(kinds["good"]))
    assert not data["failures"], data["failures"][:3]
    assert marked(mark) == [], marked(mark)  # no llama-server, worker or Valkey left
    print(f"\nllama-server under fleetgen run --engine-cmd, SIGKILLed at {at_kill}/{ROWS} rows: "
          f"serving again {restart_s:.1f} s later (load average {load:.1f} at the kill on "
          f"{os.cpu_count()} cores)")
