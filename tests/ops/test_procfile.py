"""Procfile.sim under honcho: the operator's process set completes a run through its drainer."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from fleetgen import exitcodes
from fleetgen.cli import main as cli
from fleetgen.local.ports import (
    PortInUse,
    PortLease,
    lease_port,
    listens_on,
    on_leased_port,
    says_address_in_use,
)
from fleetgen.local.simgpus import sim_ports_reported
from fleetgen.local.valkey import probe_valkey
from fleetgen.queue.contract import worker_key
from fleetgen.runstate.keys import RunKeys
from tests.support.content import assert_content, sim_config
from tests.support.ops import REPO, VENV_BIN, sample, scrape, venv_env
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.waiting import wait_until

GPUS = 2  # of Procfile.sim's 8: two cores cannot start 8 workers and 8 servers quickly
CONTEXT = 4096
RUN = "ops-honcho"
PROCESSES = ["valkey", *[f"sim{g}" for g in range(GPUS)], *[f"worker{g}" for g in range(GPUS)],
             "drain", "flower", "metrics"]
PORTS = 3 + GPUS  # Valkey, Flower, the exporter, then one per simulator


@dataclass
class HonchoFleet:
    tmp: Path
    env: dict[str, str] = field(repr=False)  # holds the passwords
    proc: subprocess.Popen[bytes]
    log: Path
    password: str = field(repr=False)
    flower_auth: tuple[str, str] = field(repr=False)
    workers: list[str]
    watch_lines: list[str] = field(default_factory=list)

    @property
    def redis_url(self) -> str:
        return self.env["FLEETGEN_REDIS_URL"]

    def url(self, port_var: str) -> str:
        return f"http://127.0.0.1:{self.env[port_var]}"

    def engine_url(self, gpu: int) -> str:
        return f"http://127.0.0.1:{int(self.env['ENGINE_PORT_BASE']) + gpu}"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url)

    def check_alive(self) -> None:
        output = self.log.read_text(errors="replace")
        if says_address_in_use(output):
            raise PortInUse(f"a server of the set found its port taken:\n{output[-2000:]}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"honcho exited with {self.proc.returncode}:\n"
                               f"{output[-4000:]}")


def write_env(path: Path, values: dict[str, str]) -> None:
    path.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items()))


@pytest.fixture(scope="module")
def honcho_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HonchoFleet]:
    tmp = tmp_path_factory.mktemp("honcho")
    secrets_ = (secrets.token_urlsafe(16), ("ops", secrets.token_urlsafe(12)))
    # The Procfile's servers take fixed ports from .env: one leased block for all of them,
    # held until honcho is gone, and a new block if one of them finds its port taken.
    lease, fleet = on_leased_port(lambda held: _start_honcho(tmp, held, *secrets_),
                                  count=PORTS)
    try:
        yield fleet
    finally:
        _stop_honcho(fleet.proc)
        lease.close()


def _start_honcho(tmp: Path, lease: PortLease, password: str,
                  flower_auth: tuple[str, str]) -> HonchoFleet:
    redis_port, flower_port, metrics_port, engine_base = lease.ports[:4]
    values = {
        "FLEETGEN_REDIS_URL": f"redis://:{password}@127.0.0.1:{redis_port}/0",
        "FLOWER_BASIC_AUTH": f"{flower_auth[0]}:{flower_auth[1]}",
        "FLOWER_PORT": str(flower_port), "METRICS_PORT": str(metrics_port),
        "RUN": RUN, "OUT": str(tmp / "out"), "CONTEXT_LENGTH": str(CONTEXT), "SLOTS": "8",
        "VALKEY_DIR": str(tmp / "valkey"), "ENGINE_PORT_BASE": str(engine_base),
        # ~0.5 s per prompt, so prompts are in flight long enough to be seen.
        "SIM_ARGS": "--ttft-ms 20 --tpot-ms 4 --output-tokens-mean 120",
        "FLEETGEN_HEALTH_INTERVAL_S": "0.5",
    }
    write_env(tmp / ".env", values)
    log = tmp / f"honcho-{lease.port}.log"  # one per attempt: pids are read from it
    argv = [str(VENV_BIN / "honcho"), "-f", str(REPO / "Procfile.sim"), "-e", str(tmp / ".env"),
            "start", *PROCESSES]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=tmp, env=venv_env(), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    host = socket.gethostname()
    fleet = HonchoFleet(tmp, {**values}, proc, log, password, flower_auth,
                        [f"gpu{g}@{host}" for g in range(GPUS)])
    try:
        wait_until(lambda: _ready(fleet), 90, "honcho's process set to serve, as ours",
                   poll_s=0.2, check=fleet.check_alive)
    except BaseException:
        _stop_honcho(proc)
        raise
    return fleet


def _ready(fleet: HonchoFleet) -> bool:
    """Every server of the set answers, and from the process honcho started for it (another
    server on a leased port would otherwise pass for ours)."""
    pids = {name: _started_pid(fleet.log, name) for name in ("valkey", "flower", "metrics")}
    if None in pids.values():
        return False
    client = redis.Redis.from_url(fleet.redis_url, socket_connect_timeout=1, socket_timeout=2)
    try:
        if not probe_valkey(client, pids["valkey"] or 0):
            return False
        workers = all(client.exists(worker_key(w)) for w in fleet.workers)
    except redis.ConnectionError:
        return False
    finally:
        client.close()
    engine_base = int(fleet.env["ENGINE_PORT_BASE"])
    return (workers and all(_sim_ports(fleet.log, g) == [engine_base + g] for g in range(GPUS))
            and listens_on(pids["flower"] or 0, int(fleet.env["FLOWER_PORT"]))
            and listens_on(pids["metrics"] or 0, int(fleet.env["METRICS_PORT"])))


def _sim_ports(log: Path, gpu: int) -> list[int]:
    """The port simulator `gpu` reports in its own ready line (honcho prefixes its output)."""
    lines = [line.split("| ", 1)[1] for line in log.read_text(errors="replace").splitlines()
             if re.match(rf"\S+ sim{gpu}\.1\s+\| ", line)]
    return sim_ports_reported("\n".join(lines))


def _stop_honcho(proc: subprocess.Popen[bytes]) -> None:
    """What an operator's Ctrl-C does: honcho TERMs every process (and KILLs after 5 s)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _started_pid(log: Path, name: str) -> int | None:
    found = re.search(rf"{name}\.1 started \(pid=(\d+)\)", log.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def _pid(log: Path, name: str) -> int:
    pid = _started_pid(log, name)
    assert pid is not None, f"honcho did not report {name}'s pid"
    return pid


@dataclass
class CompletedRun:
    ids: set[str]
    data: dict[str, list[dict[str, Any]]]
    peak_in_flight: dict[str, int]


@pytest.fixture(scope="module")
def completed_run(honcho_fleet: HonchoFleet) -> CompletedRun:
    """`fleetgen produce` by hand, as the docs say; the Procfile's drainer writes the output."""
    fleet = honcho_fleet
    prompts = fleet.tmp / "prompts.jsonl"
    kinds = make_prompts(prompts, 160, too_long=2, seed=5)
    env = venv_env(FLEETGEN_REDIS_URL=fleet.redis_url)
    watch = subprocess.Popen([str(VENV_BIN / "fleetgen"), "status", "--run", RUN, "--watch",
                              "--json", "--interval", "0.3"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    threading.Thread(target=_collect_lines, args=(watch, fleet.watch_lines), daemon=True).start()
    producer = subprocess.Popen(
        [str(VENV_BIN / "fleetgen"), "produce", str(prompts), "--run", RUN, "--context-length",
         str(CONTEXT), "--max-output-tokens", "512"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    client = fleet.client()

    def check() -> None:
        fleet.check_alive()
        if producer.poll() not in (None, 0):
            assert producer.stderr is not None
            raise RuntimeError(f"fleetgen produce failed: {producer.stderr.read().decode()}")

    peak: dict[str, int] = Counter()

    def written_all() -> bool:
        for w in fleet.workers:
            peak[w] = max(peak[w], int(client.hget(worker_key(w), "inflight") or 0))
        written = client.hgetall(RunKeys(RUN).written)
        total = client.hget(RunKeys(RUN).manifest, "total")
        return total is not None and sum(int(written.get(k, 0)) for k in
                                         (b"done", b"failed", b"rejected")) == int(total)

    try:
        wait_until(written_all, 90, "the Procfile's drainer to write every row", poll_s=0.1,
                   check=check)
    finally:
        for proc in (watch, producer):
            proc.terminate()
            proc.wait(timeout=10)
    expected = set(kinds["good"]) | set(kinds["too_long"])
    return CompletedRun(expected, assert_exactly_once(fleet.tmp / "out", expected), dict(peak))


def _collect_lines(proc: subprocess.Popen[bytes], lines: list[str]) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        lines.append(raw.decode())


def test_procfile_sim_completes_a_run_through_its_drainer(honcho_fleet: HonchoFleet,
                                                         completed_run: CompletedRun) -> None:
    data = completed_run.data
    assert len(data["results"]) == 160 and not data["failures"]
    env = honcho_fleet.env  # the flags Procfile.sim gives every simulator
    config = sim_config(["--context-length", env["CONTEXT_LENGTH"], "--max-running-requests",
                         env["SLOTS"], *shlex.split(env["SIM_ARGS"])])
    assert assert_content(data["results"], honcho_fleet.tmp / "prompts.jsonl", config) == 160
    assert {r["id"] for r in data["rejected"]} == {"long0", "long1"}
    by_worker = Counter(r["worker"] for r in data["results"])
    assert set(by_worker) == set(honcho_fleet.workers), by_worker  # both GPUs did work
    assert all(r["prompt_tokens"] + r["max_tokens"] < CONTEXT for r in data["results"])
    # Prompts were seen in flight on the workers' heartbeats while the run went on.
    assert max(completed_run.peak_in_flight.values()) > 0, completed_run.peak_in_flight
    # Every process of the set is still up (the --follow drainer never exits by itself).
    honcho_fleet.check_alive()
    log = honcho_fleet.log.read_text(errors="replace")
    assert "stopped (rc=" not in log, log[-3000:]
    # The Redis password and Flower's password never reach the logs.
    assert honcho_fleet.password not in log
    assert honcho_fleet.flower_auth[1] not in log


def test_metrics_exporter_matches_the_completed_run(honcho_fleet: HonchoFleet,
                                                    completed_run: CompletedRun) -> None:
    results = completed_run.data["results"]
    client = honcho_fleet.client()
    # In flight comes from heartbeats: wait until every worker has reported its idle state.
    wait_until(lambda: all(client.hget(worker_key(w), "inflight") == b"0"
                         for w in honcho_fleet.workers), 10, "workers to report 0 in flight")
    m = scrape(honcho_fleet.url("METRICS_PORT") + "/metrics")
    assert sample(m, "fleetgen_up") == 1
    assert sample(m, "fleetgen_rows_total", run=RUN, outcome="done") == len(results)
    assert sample(m, "fleetgen_rows_total", run=RUN, outcome="failed") == 0
    assert sample(m, "fleetgen_rows_total", run=RUN, outcome="rejected") == 2
    assert sample(m, "fleetgen_rows_written_total", run=RUN, outcome="done") == len(results)
    assert sample(m, "fleetgen_rows_truncated_total", run=RUN) == sum(
        r["finish_reason"] == "length" for r in results)
    assert sample(m, "fleetgen_tokens_total", run=RUN, kind="completion") == sum(
        r["completion_tokens"] for r in results)
    assert sample(m, "fleetgen_tokens_total", run=RUN, kind="prompt") == sum(
        r["prompt_tokens"] for r in results)
    assert sample(m, "fleetgen_run_rows", run=RUN) == 162
    assert sample(m, "fleetgen_queue_depth") == 0
    assert sample(m, "fleetgen_run_in_flight", run=RUN) == 0
    by_worker = Counter(r["worker"] for r in results)
    for w in honcho_fleet.workers:
        assert sample(m, "fleetgen_worker_rows_total", run=RUN, worker=w,
                      outcome="done") == by_worker[w]
        assert sample(m, "fleetgen_worker_in_flight", worker=w) == 0
        assert sample(m, "fleetgen_worker_healthy", worker=w) == 1
        assert sample(m, "fleetgen_worker_concurrency", worker=w) == 8


def test_status_json_and_watch_report_the_run(honcho_fleet: HonchoFleet,
                                              completed_run: CompletedRun) -> None:
    results = completed_run.data["results"]
    out = subprocess.run([str(VENV_BIN / "fleetgen"), "status", "--run", RUN, "--json"],
                         env=venv_env(FLEETGEN_REDIS_URL=honcho_fleet.redis_url),
                         capture_output=True, timeout=30, check=True)
    s = orjson.loads(out.stdout)
    assert (s["done"], s["rejected"], s["failed"], s["total"]) == (len(results), 2, 0, 162)
    assert s["written"] == 162 and s["queued"] == 0
    assert s["truncation_rate"] == round(
        sum(r["finish_reason"] == "length" for r in results) / len(results), 4)
    workers = {w["name"]: w for w in s["workers"]}
    by_worker = Counter(r["worker"] for r in results)
    assert {n: w["done"] for n, w in workers.items()} == dict(by_worker)
    assert all(w["healthy"] and w["concurrency"] == 8 for w in workers.values())
    assert honcho_fleet.password not in out.stdout.decode()

    # --watch --json: one object per refresh, rates measured between refreshes.
    frames = [orjson.loads(line) for line in honcho_fleet.watch_lines]
    assert len(frames) >= 3, honcho_fleet.watch_lines
    assert frames[0]["recent_rows_per_s"] is None  # no window before the second refresh
    assert any((f["recent_rows_per_s"] or 0) > 0 for f in frames[1:])
    assert any(w["in_flight"] for f in frames for w in f["workers"])
    assert [f["done"] for f in frames] == sorted(f["done"] for f in frames)


def test_flower_under_the_procfile_requires_its_password(honcho_fleet: HonchoFleet) -> None:
    base = honcho_fleet.url("FLOWER_PORT")
    assert httpx.get(base + "/workers", timeout=10).status_code == 401
    assert httpx.get(base + "/workers", auth=("ops", "wrong"), timeout=10).status_code == 401
    # status=1: Flower's view from worker events (what its dashboard shows), name -> online.
    ok = httpx.get(base + "/api/workers?status=1", auth=honcho_fleet.flower_auth, timeout=30)
    assert ok.status_code == 200
    assert {w: True for w in honcho_fleet.workers}.items() <= ok.json().items(), ok.json()


def test_check_command_probes_redis_engine_and_worker(honcho_fleet: HonchoFleet,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    url = honcho_fleet.redis_url
    ok = ["check", "--redis", url, "--engine-url", honcho_fleet.engine_url(0),
          "--worker", "gpu0@%h"]
    assert cli.main(ok) == exitcodes.OK
    # Leased: ports nothing of ours listens on, and nobody else is handed meanwhile.
    with lease_port(count=2) as nothing:
        dead_engine = f"http://127.0.0.1:{nothing.ports[0]}"
        assert cli.main(["check", "--redis", url, "--engine-url", dead_engine]) == \
            exitcodes.UNAVAILABLE
        assert cli.main(["check", "--redis", url, "--worker", "gpu7@%h"]) == \
            exitcodes.UNAVAILABLE
        wrong_password = re.sub(r":[^:@]+@", ":nope@", url)
        assert cli.main(["check", "--redis", wrong_password]) == exitcodes.UNAVAILABLE
        no_redis = f"redis://127.0.0.1:{nothing.ports[1]}/0"
        assert cli.main(["check", "--redis", no_redis, "--timeout-s", "1"]) == \
            exitcodes.UNAVAILABLE
    printed = capsys.readouterr().out
    assert f"FAIL redis: {no_redis} unreachable" in printed
    assert "ok   worker gpu0@" in printed and "FAIL engine" in printed
    assert "FAIL worker gpu7@" in printed and "password refused" in printed
    assert honcho_fleet.password not in printed


def _procfile(name: str) -> dict[str, str]:
    from honcho.environ import parse_procfile

    return dict(parse_procfile((REPO / name).read_text()).processes)


def test_procfile_pins_each_worker_to_its_own_gpu_server() -> None:
    procs = _procfile("Procfile")
    assert set(procs) == {"valkey", "drain", "flower", "metrics",
                          *(f"sglang{n}" for n in range(8)), *(f"worker{n}" for n in range(8))}
    for n in range(8):
        sglang, worker = procs[f"sglang{n}"], procs[f"worker{n}"]
        assert sglang.startswith(f"CUDA_VISIBLE_DEVICES={n} exec python -m sglang.launch_server")
        for part in (f"--port 3000{n}", "--context-length $CONTEXT_LENGTH",
                     "--mem-fraction-static 0.88", "--enable-metrics", '"$MODEL"'):
            assert part in sglang, (n, part)
        assert worker.startswith(f"FLEETGEN_ENGINE_URL=http://127.0.0.1:3000{n} exec celery "
                                 f"-A workers worker -Q fleetgen -n gpu{n}@%h -P threads -c $SLOTS")
    assert "--follow" in procs["drain"]
    assert "FLOWER_BASIC_AUTH:?" in procs["flower"]  # refuses to start without auth
    # Procfile.sim is the same process set with simulators in place of SGLang.
    sim = _procfile("Procfile.sim")
    assert {k: v for k, v in sim.items() if not k.startswith(("sim", "worker"))} == \
        {k: v for k, v in procs.items() if not k.startswith(("sglang", "worker"))}
    assert {k for k in sim if k.startswith("sim")} == {f"sim{n}" for n in range(8)}


def test_procfile_fleetgen_commands_use_real_flags() -> None:
    parser = cli.build_parser()
    lines = [c for name in ("Procfile", "Procfile.sim") for c in _procfile(name).values()]
    commands = [part.strip().removeprefix("exec ") for c in lines
                for part in re.split(r"&&|;", c)]
    commands = [c for c in commands if c.startswith("fleetgen ")]
    assert len(commands) >= 8 + 2 * 2  # sims; valkey, check, drain, metrics in both files
    for command in commands:
        command = command.replace("$SIM_ARGS", "")  # extra flags, empty by default
        argv = shlex.split(re.sub(r"\$\(\([^)]*\)\)|\$\{?\w+[^}\s\"]*\}?", "1", command))
        parser.parse_args(argv[1:])


def test_stopping_the_drainer_writes_a_complete_summary_and_stops_the_set(
        honcho_fleet: HonchoFleet, completed_run: CompletedRun) -> None:
    """Last in this module: SIGTERM to the drainer (honcho runs each process in its own
    group) ends it cleanly while Valkey is still up, and honcho then stops the rest."""
    os.killpg(_pid(honcho_fleet.log, "drain"), signal.SIGTERM)
    honcho_fleet.proc.wait(timeout=30)
    log = honcho_fleet.log.read_text(errors="replace")
    assert "drain.1 stopped (rc=0)" in log, log[-3000:]
    summary = orjson.loads((honcho_fleet.tmp / "out" / "summary.json").read_bytes())
    assert summary["complete"] is True
    assert (summary["done"], summary["rejected"], summary["failed"]) == (160, 2, 0)
