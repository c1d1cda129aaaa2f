"""`fleetgen run` as a user runs it: against servers started separately (`fleetgen sim`, as real
servers are), a relative --out, Ctrl-C mid-run, the same command again, every row once and no
process left behind; more hosts joining through --listen with a worker started by hand."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from fleetgen import exitcodes
from fleetgen.local.ports import lease_port
from fleetgen.local.procs import celery_worker_argv
from fleetgen.local.simgpus import SimGpus
from tests.support.cli import fleetgen_cli
from tests.support.content import assert_fleet_content
from tests.support.held import worker_name
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.sims import engine_flags, separate_sims
from tests.support.waiting import wait_until

# Slow enough that the run is still going when it is interrupted or joined: 8 slots a server,
# 4 ms a token, ~250 tokens an answer.
SIMS = SimGpus(gpus=2, context_length=4096, max_running_requests=8, tpot_ms=4.0,
               output_tokens_mean=250)


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[tuple[SimGpus, list[str]]]:
    """Two simulated servers in a process of their own, as a user starts `fleetgen sim`; the
    SimGpus that names their config (never started itself)."""
    with separate_sims(tmp_path, SIMS) as urls:
        yield SIMS, urls


def run_argv(prompts: Path, urls: list[str], *extra: str) -> list[str]:
    return fleetgen_cli("run", str(prompts), *engine_flags(urls),
                        "--out", "out/run", *extra)


def written(out: Path) -> int:
    path = out / "results.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def start_run(tmp_path: Path, argv: list[str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """`fleetgen run` in the background from `tmp_path`, its output in NAME.log."""
    log = tmp_path / f"{name}.log"
    with log.open("wb") as stdout:
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=stdout, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return proc, log


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_run_interrupted_and_resumed_writes_every_row_once(
        servers: tuple[SimGpus, list[str]], tmp_path: Path) -> None:
    fleet, urls = servers
    prompts = tmp_path / "p.jsonl"
    rows = 300
    kinds = make_prompts(prompts, rows)
    out = tmp_path / "out" / "run"
    first, log = start_run(tmp_path, run_argv(prompts, urls), "run1")
    wait_until(lambda: written(out) >= 30 or first.poll() is not None, 120,
               "the first rows written")
    assert first.poll() is None, log.read_text()[-3000:]
    children = descendants(first.pid)
    assert len(children) >= 3, children  # Valkey and two workers
    first.send_signal(signal.SIGINT)  # Ctrl-C
    assert first.wait(timeout=5) == exitcodes.INTERRUPTED, log.read_text()[-3000:]
    at_stop = written(out)
    assert at_stop < rows, "the run ended before the interrupt: the test proves nothing"
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[c.cmdline()[:4] for c in alive]}"
    text = log.read_text()
    assert text.count("fleetgen run: interrupted") == 1 and "same command" in text, text[-2000:]
    assert (out / ".fleetgen-state" / "redis.url").exists()  # kept to resume

    again = subprocess.run(run_argv(prompts, urls), cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming run run-" in again.stdout
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == rows and not data["failures"]
    assert assert_fleet_content(fleet, prompts, data) == rows
    assert not (out / ".fleetgen-state").exists()  # complete: nothing left to resume
    assert "  complete                   yes" in again.stdout
    assert (out / "report.html").exists()
    print(f"\nfleetgen run: {at_stop} of {rows} rows written at Ctrl-C; the same command "
          f"wrote the other {rows - at_stop}, each row once")


def test_a_worker_started_by_hand_joins_a_listening_run(
        servers: tuple[SimGpus, list[str]], tmp_path: Path) -> None:
    fleet, urls = servers
    prompts = tmp_path / "p.jsonl"
    rows = 200
    kinds = make_prompts(prompts, rows)
    out = tmp_path / "out" / "run"
    lease = lease_port()
    port = lease.port
    lease.close()
    run, log = start_run(tmp_path, run_argv(prompts, urls[:1], "--listen", f"127.0.0.1:{port}"),
                         "run")
    worker: subprocess.Popen[bytes] | None = None
    page: LivePage | None = None
    try:
        wait_until(lambda: "join with" in log.read_text() or run.poll() is not None, 120,
                   "the line for other hosts' workers")
        joined = re.search(r"FLEETGEN_REDIS_URL=(\S+) FLEETGEN_ENGINE_URL=\S+ celery -A "
                           r"workers worker -Q fleetgen -n gpuN@%h -P threads", log.read_text())
        assert joined, log.read_text()
        url = joined.group(1)
        assert f":{port}/0" in url and url.startswith("redis://:")
        # The line as printed, with this "host's" own server and name (gpu1: the run named
        # its one worker gpu0).
        env = {**os.environ, "FLEETGEN_REDIS_URL": url, "FLEETGEN_ENGINE_URL": urls[1]}
        worker_log = tmp_path / "worker.log"
        with worker_log.open("wb") as wout:
            worker = subprocess.Popen(celery_worker_argv("gpu1", None, "WARNING"), env=env,
                                      stdout=wout, stderr=subprocess.STDOUT)
        # And its live page, as docs/report.md starts it (the default --interval).
        page = LivePage(tmp_path, env, run_named(log))
        assert run.wait(timeout=300) == 0, log.read_text()[-3000:]
        # The run it joined is complete: the worker ends by itself, 0, saying so once.
        assert worker.wait(timeout=30) == 0, worker_log.read_text()[-3000:]
        said = [line for line in worker_log.read_text().splitlines()
                if "fleetgen worker" in line]
        assert len(said) == 1 and "is complete" in said[0], worker_log.read_text()[-3000:]
        assert "Trying again" not in worker_log.read_text()
        last = page.snapshot()  # Redis is gone now: what the page keeps is the end
        assert last["ended"] and last["error"] is None, last
        assert last["status"]["state"] == "complete" and last["status"]["done"] == rows
        assert last["status"]["in_flight"] == 0 and last["status"]["queued"] == 0
    finally:
        if page is not None:
            page.stop()
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(timeout=60)
        if run.poll() is None:
            run.kill()
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == rows
    assert_fleet_content(fleet, prompts, data)
    by_hand = sum(r["worker"] == worker_name(1) for r in data["results"])
    assert by_hand > 0, "the worker started by hand wrote nothing"
    print(f"\nfleetgen run --listen: the worker started by hand wrote {by_hand} of {rows}, "
          f"left by itself when the run was complete; the live page ended at "
          f"{last['status']['done']} done")


def run_named(log: Path) -> str:
    found = re.search(r"fleetgen run: (?:starting|resuming) run (\S+):", log.read_text())
    assert found, log.read_text()[-3000:]
    return found.group(1)


class LivePage:
    """`fleetgen status --run NAME --serve 0` in a process of its own, read over HTTP."""

    def __init__(self, cwd: Path, env: dict[str, str], run: str) -> None:
        self.log = cwd / "status.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(fleetgen_cli("status", "--run", run, "--serve", "0"),
                                         cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        wait_until(lambda: "live page of run" in self.log.read_text()
                   or self.proc.poll() is not None, 60, "the live page's line")
        found = re.search(r"at (http://\S+) \(user (\S+), password (\S+)\)",
                          self.log.read_text())
        assert found, self.log.read_text()
        self.url, self.auth = found.group(1), (found.group(2), found.group(3))

    def snapshot(self) -> dict[str, Any]:
        reply = httpx.get(f"{self.url.rstrip('/')}/status.json", auth=self.auth, timeout=10)
        reply.raise_for_status()
        return dict(reply.json())

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)


def test_a_changed_setting_on_resume_is_one_line_before_the_workers_start(
        servers: tuple[SimGpus, list[str]], tmp_path: Path) -> None:
    _, urls = servers
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 300)
    out = tmp_path / "out" / "run"
    first, log = start_run(tmp_path, run_argv(prompts, urls, "--max-output-tokens", "300"),
                           "run1")
    wait_until(lambda: written(out) >= 10 or first.poll() is not None, 120, "rows written")
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=5) == exitcodes.INTERRUPTED, log.read_text()[-3000:]
    again = subprocess.run(run_argv(prompts, urls, "--max-output-tokens", "200"),
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == exitcodes.CONFIG, again.stdout + again.stderr
    said = [line for line in again.stderr.splitlines() if line.startswith("fleetgen run:")]
    assert len(said) == 1 and "--max-output-tokens" in said[0] and "300" in said[0], said
    assert "another --out" in said[0] and "None" not in said[0]
    assert "watch it from another shell" not in again.stdout  # no worker was started
