"""Worker CPU bench: CPU seconds per request of one fleetgen worker against the CPU of a plain
asyncio client sending the same requests to the same simulator, in the same run.

One simulated server that answers at once (zero time to first token and per token, K slots),
one embedded Valkey, one real Celery worker (`-P threads -c K+1`, as `fleetgen demo` starts
it). The worker phase LPUSHes ready-made task messages (the producer's own `task_message`)
and waits until the run's `done` counter reaches the count; the client phase is the seed's
way (`bench/baseline.py`: httpx.AsyncClient, K+1 in flight, one JSONL writer) in this
process. Both send the same token ids with the same sampling, so the simulator returns the
same answers to both. CPU is process CPU time (user + system, from /proc via psutil), not
wall time: the cores are shared, and the ratio of two figures measured in one run is what
holds. The phases alternate (`--rounds`) so that a change of load hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.baseline import FIXED_MAX_NEW_TOKENS, run_baseline
from bench.common import save, self_cpu_s, table
from fleetgen.local.fleet import FleetSpec, LocalFleet
from fleetgen.local.procs import wait_for
from fleetgen.local.simgpus import SimGpus
from fleetgen.queue.contract import QUEUE, TaskPayload
from fleetgen.queue.redisconn import connect
from fleetgen.queue.wire import task_message
from fleetgen.runstate.keys import RunKeys

SLOTS = 32
PROMPT_TOKENS = 300
WARMUP = 300


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 150_000) for _ in range(PROMPT_TOKENS)] for _ in range(count)]


def payloads(run: str, rows: list[list[int]]) -> list[TaskPayload]:
    return [TaskPayload(run=run, line=i + 1, id=f"r{i}", input_ids=ids,
                        max_tokens=FIXED_MAX_NEW_TOKENS, sampling={"temperature": 0.0}, row={})
            for i, ids in enumerate(rows)]


def worker_phase(fleet: LocalFleet, run: str, rows: list[list[int]],
                 timeout_s: float) -> dict[str, float]:
    """Push every task, then wait for the last outcome; CPU of the worker, simulator, Valkey."""
    pids = {name: [pid] for name, pid in _pids(fleet).items()}
    return timed_tasks(fleet, run, rows, pids, timeout_s)


def timed_tasks(fleet: LocalFleet, run: str, rows: list[list[int]],
                pids: dict[str, list[int]], timeout_s: float) -> dict[str, float]:
    """LPUSH ready-made task messages for `rows`, wait until the workers count them all done:
    the seconds it took and the CPU seconds each group of `pids` spent meanwhile."""
    client = connect(fleet.redis_url)
    messages = [task_message(p) for p in payloads(run, rows)]
    before = {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}
    client.hset(RunKeys(run).manifest, "state", "producing")  # workers drop unknown runs
    started = time.perf_counter()
    for i in range(0, len(messages), 512):
        client.lpush(QUEUE, *messages[i:i + 512])
    stats = RunKeys(run).stats

    def finished() -> bool:
        return int(client.hget(stats, "done") or 0) >= len(rows)

    wait_for(finished, timeout_s, f"{len(rows)} outcomes of run {run}", poll_s=0.01,
             check=lambda: _check_alive(fleet))
    seconds = time.perf_counter() - started
    used = {k: sum(cpu_s(p) for p in v) - before[k] for k, v in pids.items()}
    client.delete(*RunKeys(run).all())
    client.close()
    return {"seconds": seconds, **used}


def client_phase(fleet: LocalFleet, rows: list[list[int]], work: Path,
                 concurrency: int) -> dict[str, float]:
    """The seed's asyncio client, in this process: its CPU is this process's CPU meanwhile."""
    sim_pid = _pids(fleet)["simulator"]
    batch = [(f"c{i}", ids) for i, ids in enumerate(rows)]
    sim_before, before = cpu_s(sim_pid), self_cpu_s()
    started = time.perf_counter()
    result = asyncio.run(run_baseline([fleet.engine_url(0)], batch, concurrency,
                                      work / "client.jsonl"))
    seconds = time.perf_counter() - started
    used = {"seconds": seconds, "client": self_cpu_s() - before,
            "simulator": cpu_s(sim_pid) - sim_before}
    if result.completed != len(rows):
        raise RuntimeError(f"plain client: {result.completed} of {len(rows)} completed "
                           f"({result.failures_by_status})")
    return used


def _pids(fleet: LocalFleet) -> dict[str, int]:
    assert isinstance(fleet.servers, SimGpus) and fleet.valkey.proc is not None
    return {"worker": fleet.workers[0].proc.pid,
            "simulator": fleet.servers.children[0].proc.pid,
            "valkey": fleet.valkey.proc.pid}


def _check_alive(fleet: LocalFleet) -> None:
    for w in fleet.workers:
        if not w.alive():
            raise RuntimeError(f"worker {w.name} exited:\n{w.log_text()[-3000:]}")


def run(requests: int, rounds: int, work: Path, output_tokens_mean: int,
        worker_env: dict[str, str], loglevel: str = "WARNING",
        warmup: int = WARMUP) -> dict[str, Any]:
    concurrency = SLOTS + 1
    fleet = LocalFleet(work / "fleet", FleetSpec(concurrency=concurrency, worker_env=worker_env,
                                                 worker_loglevel=loglevel),
                       servers=SimGpus(gpus=1, max_running_requests=SLOTS, ttft_ms=0, tpot_ms=0,
                                       output_tokens_mean=output_tokens_mean))
    fleet.start()
    rounds_out: list[dict[str, Any]] = []
    try:
        # Connections, pool threads and the simulator's first answers before the clock.
        warm = prompts(warmup, seed=1)
        worker_phase(fleet, "warm", warm, timeout_s=120)
        client_phase(fleet, warm, work, concurrency)
        for r in range(rounds):
            rows = prompts(requests, seed=100 + r)
            w = worker_phase(fleet, f"bench{r}", rows, timeout_s=600)
            c = client_phase(fleet, rows, work, concurrency)
            rounds_out.append({"worker_phase": w, "client_phase": c})
    finally:
        fleet.stop()
    total = rounds * requests

    def per_req_ms(phase: str, part: str) -> float:
        return 1000 * sum(x[phase][part] for x in rounds_out) / total

    worker_ms = per_req_ms("worker_phase", "worker")
    client_ms = per_req_ms("client_phase", "client")
    worker_s = sum(x["worker_phase"]["seconds"] for x in rounds_out)
    client_s = sum(x["client_phase"]["seconds"] for x in rounds_out)
    return {
        "requests": requests, "rounds": rounds, "concurrency": concurrency, "slots": SLOTS,
        "worker_cpu_ms_per_request": worker_ms,
        "client_cpu_ms_per_request": client_ms,
        "worker_over_client": worker_ms / client_ms,
        "valkey_cpu_ms_per_request": per_req_ms("worker_phase", "valkey"),
        "simulator_cpu_ms_per_request": {"worker phase": per_req_ms("worker_phase", "simulator"),
                                         "client phase": per_req_ms("client_phase", "simulator")},
        "worker_requests_per_s": total / worker_s,
        "client_requests_per_s": total / client_s,
        "worker_env": worker_env, "worker_loglevel": loglevel,
        "per_round": rounds_out,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench worker", description=__doc__)
    parser.add_argument("--requests", type=int, default=3000, help="per round and phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output-tokens-mean", type=int, default=200)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the worker (repeatable)")
    parser.add_argument("--warmup", type=int, default=WARMUP,
                        help="requests of each kind sent before anything is measured")
    parser.add_argument("--loglevel", default="WARNING",
                        help="the worker's -l (the Procfile runs INFO)")
    parser.add_argument("--no-save", action="store_true",
                        help="print only; leave bench/figures/ as it is")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        r = run(args.requests, args.rounds, Path(tmp), args.output_tokens_mean, env,
              args.loglevel, args.warmup)
    print(table(f"worker CPU: {args.rounds} x {args.requests:,} requests of {PROMPT_TOKENS} "
                f"tokens, one zero-latency simulator ({SLOTS} slots), -c {r['concurrency']}, "
                f"{psutil.cpu_count()} cores",
                ["who", "CPU ms / request", "requests/s", "simulator CPU ms / request"],
                [["fleetgen worker", r["worker_cpu_ms_per_request"],
                  r["worker_requests_per_s"], r["simulator_cpu_ms_per_request"]["worker phase"]],
                 ["plain asyncio client", r["client_cpu_ms_per_request"],
                  r["client_requests_per_s"], r["simulator_cpu_ms_per_request"]["client phase"]]]))
    print(f"worker / client CPU: {r['worker_over_client']:.2f}; Valkey "
          f"{r['valkey_cpu_ms_per_request']:.3f} ms / request in the worker phase")
    if not args.no_save:
        save("worker", r, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
