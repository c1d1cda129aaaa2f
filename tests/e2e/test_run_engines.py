"""`fleetgen run` says what happens to its engines in its own output, as a user sees it in a log:
three servers started on their own on consecutive ports (the README's range form), one of
them SIGKILLed mid-run and started again: the run names the server that stopped answering,
that its prompts went back to the queue, when it came back, and shows the engines up in its
progress line; every request is still written once."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetgen.local.ports import lease_port
from fleetgen.local.simgpus import SimGpus, sim_ports_reported
from tests.support.cli import fleetgen_cli
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.waiting import wait_until

# 8 slots a server, 8 ms a token, ~250 tokens: about 4 answers a second a server, so 400
# requests take long enough for a kill, a line in the log and a restart (~40 s).
SIMS = SimGpus(gpus=3, context_length=4096, max_running_requests=8, tpot_ms=8.0,
               output_tokens_mean=250)


class Servers:
    """Three simulators, each a process of its own on a port of a leased block (so one can
    be killed and started again on the same port, as a restarted server is)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.lease = lease_port(count=3)
        self.ports = self.lease.ports
        self.lease.close()  # the servers bind them now
        self.procs = [self.start(i) for i in range(3)]

    def start(self, i: int) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"sim{i}-{len(list(self.tmp_path.glob(f'sim{i}-*')))}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                SIMS.argv(1, ["--port", str(self.ports[i])]), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: sim_ports_reported(log.read_text()) == [self.ports[i]]
                   or proc.poll() is not None, 60, f"simulator {i}'s ready line")
        assert proc.poll() is None, log.read_text()
        return proc

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:  # a loaded machine: do not leave it behind
                    proc.kill()
                    proc.wait(timeout=10)


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[Servers]:
    started = Servers(tmp_path)
    try:
        yield started
    finally:
        started.stop()


def written(out: Path) -> int:
    path = out / "results.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_a_dead_engine_is_said_in_the_runs_own_output(servers: Servers,
                                                      tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    kinds = make_prompts(prompts, 400)
    with prompts.open("ab") as f:  # one row of two samples: 402 requests from 401 lines
        f.write(b'{"id": "twice", "prompt": "Say it twice.", "sampling": {"n": 2}}\n')
    first, last = servers.ports[0], servers.ports[-1]
    log = tmp_path / "run.log"
    with log.open("wb") as out:  # a log, no terminal: the line every 10 s
        run = subprocess.Popen(
            fleetgen_cli("run", str(prompts), "--engine-url",
                         f"http://127.0.0.1:{first}-{last}", "--out", "out/run"),
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out_dir = tmp_path / "out" / "run"
    dead = servers.url(1)
    try:
        wait_until(lambda: written(out_dir) >= 20 or run.poll() is not None, 120,
                   "the first rows written")
        assert run.poll() is None, log.read_text()[-3000:]
        servers.procs[1].send_signal(signal.SIGKILL)
        servers.procs[1].wait(timeout=10)
        wait_until(lambda: f"engine {dead} stopped answering" in log.read_text()
                   or run.poll() is not None, 30, "the run saying the engine stopped")
        wait_until(lambda: "engines 2/3" in log.read_text() or run.poll() is not None, 30,
                   "a progress line with two engines of three up")
        servers.procs[1] = servers.start(1)  # the same server, back on its port
        wait_until(lambda: f"engine {dead} answers again" in log.read_text()
                   or run.poll() is not None, 60, "the run saying the engine is back")
        assert run.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
    text = log.read_text()
    (down,) = [line for line in text.splitlines() if f"engine {dead} stopped" in line]
    assert down.startswith("fleetgen run: ") and "back to the queue" in down, down
    # The kill landed on work: the engine held prompts when it died (its worker's count).
    held = re.search(r"the (\d+) prompt\(s\) it was answering go back", down)
    assert held and int(held.group(1)) > 0, down
    (back,) = [line for line in text.splitlines() if f"engine {dead} answers again" in line]
    assert re.search(r"answers again at \d\d:\d\d:\d\d \(down \d+m\d\ds\)", back), back
    assert re.search(r"requests written, [\d.]+/s, engines 3/3, ETA \d+m\d\ds", text), text
    data = assert_exactly_once(out_dir, set(kinds["good"]) | {"twice#0", "twice#1"})
    assert len(data["results"]) == 402
    table = dict(re.findall(r"^  (requests|input lines) +(\d+)$", text, re.MULTILINE))
    assert table == {"requests": "402", "input lines": "401"}, text[-2000:]
    print(f"\n{down}\n{back}")
