"""`fleetgen run --engine-cmd` starts, keeps and stops its engines (`fleetgen sim --port
{port}` as the launched engine, fake GPUs): an engine SIGKILLed mid-run comes back on its URL
(`status` shows the restart) while a `fleetgen node` joined from the line `--listen` prints
helps, and every row is written once, the node gone by itself at the end; SIGTERM mid-run
leaves no process behind and the same command resumes; engines that all fail to start are
exit 3 in one line, nothing left, as is an engine the pre-flight refuses; an engine whose
requests all hang while its probe passes (`/_sim/hang`) is restarted once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fleetgen import exitcodes
from fleetgen.engine.health import probe_url
from fleetgen.local.ports import lease_port
from tests.support.cli import fleetgen_cli
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.survivors import marked, new_mark
from tests.support.waiting import wait_until

# 8 slots, 5 ms a token, ~150 tokens: ~20 answers a second from the two engines, so 300 rows
# take long enough (~15 s) for a kill and a restart in the middle.
SIM = (f"{sys.executable} -m fleetgen.simulator --port {{port}} --max-running-requests 8 "
       "--tpot-ms 5 --output-tokens-mean 150 --context-length 4096 --ttft-ms 0")
# The workers call a simulator gone after 3 s, not a real server's 10.
QUICK_WORKERS = {"FLEETGEN_HEALTH_INTERVAL_S": "1", "FLEETGEN_ENGINE_GONE_S": "3"}


class Run:
    """`fleetgen run` in the background, its output in a file, with a mark in its
    environment that every process it starts inherits (tests/support/survivors.py)."""

    def __init__(self, tmp_path: Path, *args: str, name: str = "run",
                 env: dict[str, str] | None = None) -> None:
        self.mark = new_mark()
        self.log = tmp_path / f"{name}.log"
        env = {**os.environ, **self.mark, **QUICK_WORKERS, "CUDA_VISIBLE_DEVICES": "0,1,2",
               **(env or {})}
        with self.log.open("wb") as sink:
            self.proc = subprocess.Popen(fleetgen_cli(*args), cwd=tmp_path, env=env,
                                         stdout=sink, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def engine_pid(self, gpu: str) -> int | None:
        """The simulator running on `gpu` (its CUDA_VISIBLE_DEVICES)."""
        for entry in marked(self.mark):
            pid = int(entry.split()[0])
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if "fleetgen.simulator" in entry and f"CUDA_VISIBLE_DEVICES={gpu}".encode() in env:
                return pid
        return None

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running after {timeout_s} s:\n"
                                 f"{self.text()[-4000:]}") from None


def written(out: Path) -> int:
    path = out / "results.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def status_of(run: Run, out: Path) -> str:
    """`fleetgen status` of the run, from another shell as its first lines say."""
    name = re.findall(r"--run (\S+) --watch", run.text())[-1]
    url = (out / ".fleetgen-state" / "redis.url").read_text().strip()
    done = subprocess.run(fleetgen_cli("status", "--run", name), capture_output=True,
                          text=True, timeout=60, env={**os.environ, "FLEETGEN_REDIS_URL": url})
    return done.stdout + done.stderr


def test_a_killed_engine_comes_back_while_a_node_helps(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, 400)
    out = tmp_path / "out"
    with lease_port() as lease:
        port = lease.port
    run = Run(tmp_path, "run", str(prompts), "--engine-cmd", SIM, "--gpus", "0,1", "--out",
              "out", "--listen", f"127.0.0.1:{port}")
    node: Run | None = None
    try:
        line = wait_until(lambda: re.search(
            r"FLEETGEN_REDIS_URL=(\S+) fleetgen node --run (\S+) --engine-cmd ", run.text())
            or run.proc.poll() is not None, 120, "the line for other hosts")
        assert isinstance(line, re.Match), run.text()[-3000:]
        node = Run(tmp_path, "node", "--run", line.group(2), "--engine-cmd", SIM, "--gpus",
                   "2", name="node", env={"FLEETGEN_REDIS_URL": line.group(1),
                                          "SLURMD_NODENAME": "n2"})
        wait_until(lambda: written(out) >= 30 or run.proc.poll() is not None, 120,
                   "the first rows written")
        assert run.proc.poll() is None, run.text()[-3000:]
        url = re.findall(r"engine1 \((http://127\.0\.0\.1:\d+)\) ready after", run.text())[0]
        pid = run.engine_pid("1")
        assert pid is not None, marked(run.mark)
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: (run.engine_pid("1") or pid) != pid and probe_url(url).ready, 60,
                   "engine1 serving again")
        restart_s = time.monotonic() - killed_at
        # `status` shows the restart (the supervisor writes its engines every 2 s).
        shown = wait_until(lambda: re.search(r"engine \S+/engine1 +ready +restarts 1 +GPU 1 "
                                             r".*last: exited with code -9",
                                             status_of(run, out)), 30, "status with the restart")
        assert shown is not None
        print(f"\n{shown.group(0)}")
        assert run.wait(300) == exitcodes.OK, run.text()[-4000:]
        assert node.wait(60) == exitcodes.OK, node.text()[-4000:]
    finally:
        for proc in (run, node):
            if proc is not None and proc.proc.poll() is None:
                proc.proc.kill()
    text = run.text()
    assert f"engine1 ({url}) exited with code -9; restarting in 1 s" in text, text[-3000:]
    assert len(re.findall(rf"engine1 \({url}\) ready after", text)) == 2
    data = assert_exactly_once(out, set(kinds["good"]))
    by_node = sum(r["worker"].startswith("n2-gpu0@") for r in data["results"])
    assert by_node > 0, "the node's worker wrote nothing"
    said = node.text()
    assert "fleetgen node n2: engine0 (http://127.0.0.1:" in said and "ready after" in said
    assert f"fleetgen node n2: run {line.group(2)} is complete; stopping its engines" in said
    assert (tmp_path / ".fleetgen-node" / "n2" / "engines" / "engine0.log").exists()
    assert marked(run.mark) == [] and marked(node.mark) == []
    assert not (out / ".fleetgen-state").exists()  # complete: nothing left to resume
    print(f"simulator under fleetgen run, SIGKILL to serving again: {restart_s:.1f} s; the "
          f"node's worker wrote {by_node} of {len(data['results'])}")


def hung_requests(url: str) -> int:
    """The simulator's own count of the generation requests it let hang."""
    return int(httpx.get(f"{url}/_sim/stats", timeout=5).json()["faults_total"].get("hang", 0))


def generate_times_out(url: str, timeout_s: float) -> bool:
    try:
        httpx.post(f"{url}/generate", timeout=timeout_s, json={
            "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})
    except httpx.TimeoutException:
        return True
    return False


def test_an_engine_whose_requests_hang_while_its_probe_passes_is_restarted_once(
        tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, 300)
    out = tmp_path / "out"
    # Requests time out after 5 s, not 900, and the engine is restarted 3 s after the first
    # timeout. Every answer takes far less (256 tokens at most, 5 ms each, behind at most one
    # other in the engine's queue): an engine whose requests all outlast the timeout answers
    # nothing in time and is restarted too, which is not what this tests. A prompt's attempts
    # meanwhile (each a 5 s timeout, then a backoff) are not either, so it gets more of them.
    run = Run(tmp_path, "run", str(prompts), "--engine-cmd", SIM, "--gpus", "0,1", "--out",
              "out", "--engine-silent-s", "3", "--max-output-tokens", "256",
              env={"FLEETGEN_REQUEST_TIMEOUT_S": "5", "FLEETGEN_MAX_ATTEMPTS": "10"})
    try:
        wait_until(lambda: written(out) >= 30 or run.proc.poll() is not None, 120,
                   "the first rows written")
        assert run.proc.poll() is None, run.text()[-3000:]
        url = re.findall(r"engine1 \((http://127\.0\.0\.1:\d+)\) ready after", run.text())[0]
        pid = run.engine_pid("1")
        assert pid is not None
        httpx.post(f"{url}/_sim/hang", timeout=5).raise_for_status()
        # The fault landed: the workers' requests hang, a request of ours too, while the
        # probes the supervisor and the workers make answer 200.
        wait_until(lambda: hung_requests(url) >= 1, 30, "a worker's request hanging")
        assert generate_times_out(url, 1.0)
        assert probe_url(url).ready and httpx.get(f"{url}/health", timeout=5).status_code == 200
        assert run.engine_pid("1") == pid  # nothing restarted it yet
        wait_until(lambda: (run.engine_pid("1") or pid) != pid and probe_url(url).ready, 60,
                   "engine1 restarted")
        assert not generate_times_out(url, 10.0)  # the new process answers
        assert run.wait(300) == exitcodes.OK, run.text()[-4000:]
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    text = run.text()
    restarts = re.findall(r"engine1 \(\S+\) answered no request for \d+ s while they timed out "
                          r"and its health check passed; restarting in 1 s", text)
    assert len(restarts) == 1, text[-4000:]
    assert len(re.findall(rf"engine1 \({url}\) ready after", text)) == 2
    assert not re.search(r"engine0 \(\S+\) [^\n]*restarting", text), text[-4000:]
    data = assert_exactly_once(out, set(kinds["good"]))
    assert not data["failures"], data["failures"][:3]
    assert marked(run.mark) == []


def test_sigterm_leaves_no_survivor_and_the_same_command_resumes(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, 300)
    out = tmp_path / "out"
    args = (str(prompts), "--engine-cmd", f"bash -c 'sleep 300 & exec {SIM}'",
            "--gpus", "0,1", "--out", "out")
    first = Run(tmp_path, "run", *args, name="first")
    try:
        wait_until(lambda: written(out) >= 20 or first.proc.poll() is not None, 120,
                   "the first rows written")
        assert len(marked(first.mark)) > 4  # engines, their sleeps, workers, Valkey
        first.proc.send_signal(signal.SIGTERM)
        assert first.wait(30) == exitcodes.INTERRUPTED, first.text()[-3000:]
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert marked(first.mark) == [], first.text()[-3000:]
    assert 0 < written(out) < 300
    again = Run(tmp_path, "run", *args, name="again")
    assert again.wait(300) == exitcodes.OK, again.text()[-4000:]
    assert "resuming run" in again.text()
    assert_exactly_once(out, set(kinds["good"]))
    assert marked(again.mark) == []


def test_engines_that_all_fail_to_start_are_one_line_and_nothing_is_left(
        tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 5)
    cmd = f"{sys.executable} -c \"print('no model at /m'); raise SystemExit(2)\" {{port}}"
    run = Run(tmp_path, "run", str(prompts), "--engine-cmd", cmd, "--gpus", "0,1", "--out",
              "out")
    assert run.wait(120) == exitcodes.CONFIG, run.text()
    lines = run.text().splitlines()
    assert lines[-1].startswith("fleetgen run: no engine started (engine0: exited with code 2 "
                                "while starting); each one's log is in "), lines
    failed = [line for line in lines if "failed to start" in line]
    assert len(failed) == 2 and all("no model at /m" in line for line in failed), lines
    assert marked(run.mark) == []


def test_an_engine_the_preflight_refuses_is_one_line_and_nothing_is_left(
        tmp_path: Path) -> None:
    # `fleetgen doctor`'s checks, on each engine once it is ready and before its worker.
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 5)
    run = Run(tmp_path, "run", str(prompts), "--engine-cmd", f"{SIM} --skip-tokenizer-init",
              "--gpus", "0", "--out", "out")
    assert run.wait(120) == exitcodes.CONFIG, run.text()
    last = run.text().splitlines()[-1]
    assert last.startswith("fleetgen run: http://127.0.0.1:") and \
        "started with --skip-tokenizer-init" in last, last
    assert "Traceback" not in run.text()
    assert marked(run.mark) == []
