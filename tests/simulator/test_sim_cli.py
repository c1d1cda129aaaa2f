"""The simulator CLI as a user runs it: a subprocess, its ready line, signals, exit codes."""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import httpx
import pytest

from fleetgen.local.ports import lease_port
from fleetgen.simulator.cli import add_arguments, config_from_args
from tests.support.sim import ENDLESS, generate, stats
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


class SimProcess:
    """`python -m fleetgen.simulator` with its stdout lines collected by a reader thread."""

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleetgen.simulator", *flags], cwd=ROOT, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self.lines.put(line)

    def first_line(self, timeout_s: float = 15.0) -> str:
        try:
            return self.lines.get(timeout=timeout_s).rstrip("\n")
        except queue.Empty:
            raise AssertionError(f"no ready line; stderr: {self.stderr()}") from None

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def processes() -> Iterator[list[SimProcess]]:
    started: list[SimProcess] = []
    yield started
    for process in started:
        process.kill()


@pytest.fixture
def port_pair() -> Iterator[int]:
    """Two consecutive ports (the ready line then shows a range), held for the test. Ask for
    it before `processes`, so the simulator is gone before the lease is released."""
    with lease_port(count=2) as lease:
        yield lease.port


def test_ready_line_then_drain_on_sigterm(port_pair: int, processes: list[SimProcess]) -> None:
    port = port_pair
    sim = SimProcess("--port", str(port), "--count", "2", "--ttft-ms", "0", "--tpot-ms", "50",
                     "--output-tokens-mean", str(ENDLESS), "--max-running-requests", "4",
                     # An instant /health: a slow one could outlast the drain and be cut.
                     "--health-delay-s", "0")
    processes.append(sim)
    assert sim.first_line() == (
        f"fleetgen sim: serving 2 server(s) on http://127.0.0.1:{port}..{port + 1} "
        "(context 8192, 4 slots)"
    )
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client, \
            ThreadPoolExecutor(1) as pool:
        assert httpx.get(f"http://127.0.0.1:{port + 1}/health").status_code == 200
        in_flight = pool.submit(generate, client, [1], 16)  # 0.8 s of work
        wait_until(lambda: stats(client)["num_running_reqs"] == 1, what="running")
        sim.proc.send_signal(signal.SIGTERM)
        # Draining: health turns 503 while the request is still being served, and new
        # work is still accepted (SGLang 0.5.23 only flags `gracefully_exit`).
        wait_until(lambda: client.get("/health").status_code == 503, what="draining")
        assert generate(client, [2], 2).status_code == 200
        answer = in_flight.result()
    assert answer.status_code == 200
    assert answer.json()["meta_info"]["completion_tokens"] == 16
    assert sim.proc.wait(timeout=10) == 0
    assert "Traceback" not in sim.stderr()


def test_bad_flag_value_exits_3_with_a_named_field(processes: list[SimProcess]) -> None:
    sim = SimProcess("--port", "0", "--error-rate", "1.5")
    processes.append(sim)
    assert sim.proc.wait(timeout=15) == 3  # a bad setting, as in every other command
    stderr = sim.stderr()
    assert "SimConfig.error_rate must be in [0, 1], got 1.5" in stderr
    assert "Traceback" not in stderr


def test_port_in_use_exits_1(processes: list[SimProcess]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        sim = SimProcess("--port", str(taken.getsockname()[1]))
        processes.append(sim)
        assert sim.proc.wait(timeout=15) == 1
    assert "cannot listen on" in sim.stderr()


def test_down_window_flag_and_api_key_from_env(processes: list[SimProcess]) -> None:
    sim = SimProcess("--port", "0", "--down-window", "0:3600",
                     env={"FLEETGEN_SIM_API_KEY": "k"})
    processes.append(sim)
    url = sim.first_line().split(" on ")[1].split(" ")[0]
    assert httpx.get(f"{url}/health").status_code == 503
    assert httpx.post(f"{url}/generate", json={"input_ids": [1]}).status_code == 401
    sim.proc.send_signal(signal.SIGINT)
    assert sim.proc.wait(timeout=10) == 0


def test_mode_flags_reach_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args([
        "--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "6",
        "--enable-deterministic-inference", "--skip-tokenizer-init", "--health-delay-s", "2",
        "--max-total-num-tokens", "4096", "--dp-size", "2", "--derived-slots", "10",
    ]))
    assert config.num_reserved_tokens == 6
    assert (config.max_running_requests, config.resolved_max_running_requests) == (None, 48)
    assert (config.slots_per_dp, config.total_slots) == (24, 48)
    assert config.enable_deterministic_inference and config.skip_tokenizer_init
    assert (config.health_delay_s, config.max_total_tokens, config.dp_size) == (2.0, 4096, 2)
    plain = config_from_args(parser.parse_args(["--derived-slots", "10", "--dp-size", "2"]))
    assert (plain.resolved_max_running_requests, plain.slots_per_dp, plain.total_slots) == (
        None, 10, 20)
