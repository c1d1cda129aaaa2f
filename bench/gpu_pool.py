"""One GPU's ceiling: requests per second one GPU's worker pool sustains against a simulated
server that answers at once, with the pool as one worker process and as several processes
sharing the engine (FLEETGEN_ENGINE_SHARE, the K + 1 threads split between them).

One simulator (zero time to first token and per token, K slots), one embedded Valkey, and for
each pool shape a fresh set of real Celery workers (`-P threads`, `-c` their share of K + 1).
Ready-made task messages (the producer's own `task_message`) are LPUSHed and the clock stops
when the run's `done` counter reaches the count. The shapes alternate (`--rounds`) so that a
change of load hits all alike. Printed: requests/s per shape, its ratio to one process, the
workers' CPU per request, and the CPU the pool would need for the goal's 500 requests/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

from bench.common import save, table
from bench.worker_cpu import PROMPT_TOKENS, SLOTS, prompts, timed_tasks
from fleetgen.local.fleet import FleetSpec, LocalFleet
from fleetgen.local.simgpus import SimGpus

GOAL_PER_S = 500
WARMUP = 300


def phase(fleet: LocalFleet, run: str, rows: list[list[int]],
          timeout_s: float) -> dict[str, float]:
    """Push every task, wait for the last outcome: seconds, and CPU of workers, sim, Valkey."""
    assert isinstance(fleet.servers, SimGpus) and fleet.valkey.proc is not None
    pids = {"workers": [w.proc.pid for w in fleet.workers],
            "simulator": [fleet.servers.children[0].proc.pid],
            "valkey": [fleet.valkey.proc.pid]}
    return timed_tasks(fleet, run, rows, pids, timeout_s)


def measure_shape(work: Path, processes: int, requests: int, rounds: int,
                  output_tokens_mean: int) -> list[dict[str, float]]:
    fleet = LocalFleet(work / f"fleet-{processes}",
                       FleetSpec(concurrency=SLOTS + 1, processes_per_gpu=processes),
                       servers=SimGpus(gpus=1, max_running_requests=SLOTS, ttft_ms=0, tpot_ms=0,
                                       output_tokens_mean=output_tokens_mean))
    fleet.start()
    try:
        phase(fleet, "warm", prompts(WARMUP, seed=1), timeout_s=120)
        return [phase(fleet, f"gpu{processes}-{r}", prompts(requests, seed=100 + r), 600)
                for r in range(rounds)]
    finally:
        fleet.stop()


def run(requests: int, rounds: int, shapes: list[int], work: Path,
        output_tokens_mean: int) -> dict[str, Any]:
    per_shape: dict[int, list[dict[str, float]]] = {p: [] for p in shapes}
    for r in range(rounds):  # alternate shapes round by round
        for p in shapes:
            per_shape[p] += measure_shape(work / f"r{r}", p, requests, 1, output_tokens_mean)
    out = {}
    for p, phases in per_shape.items():
        total = requests * len(phases)
        seconds = sum(x["seconds"] for x in phases)
        workers_ms = 1000 * sum(x["workers"] for x in phases) / total
        out[str(p)] = {
            "processes": p, "requests_per_s": total / seconds,
            "workers_cpu_ms_per_request": workers_ms,
            "simulator_cpu_ms_per_request": 1000 * sum(x["simulator"] for x in phases) / total,
            "valkey_cpu_ms_per_request": 1000 * sum(x["valkey"] for x in phases) / total,
            "worker_cores_for_goal": GOAL_PER_S * workers_ms / 1000,
            # CPU seconds per wall second: ~1 for one process means it is its own limit
            # (one Python process, one core at most for its consumer loop and the GIL).
            "workers_cores_used": sum(x["workers"] for x in phases) / seconds,
            "all_cores_used": sum(x["workers"] + x["simulator"] + x["valkey"]
                                  for x in phases) / seconds,
            "phases": phases}
    one = out[str(shapes[0])]["requests_per_s"]
    for v in out.values():
        v["over_first"] = v["requests_per_s"] / one
    return {"requests": requests, "rounds": rounds, "slots": SLOTS, "threads": SLOTS + 1,
            "goal_requests_per_s": GOAL_PER_S, "shapes": out}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__)
    parser.add_argument("--requests", type=int, default=3000, help="per round and shape")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--processes", default="1,2",
                        help="pool shapes: worker processes sharing the engine")
    parser.add_argument("--output-tokens-mean", type=int, default=200)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    shapes = [int(x) for x in args.processes.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        r = run(args.requests, args.rounds, shapes, Path(tmp), args.output_tokens_mean)
    rows = [[v["processes"], v["requests_per_s"], v["over_first"],
             v["workers_cpu_ms_per_request"], v["simulator_cpu_ms_per_request"],
             v["workers_cores_used"], v["all_cores_used"], v["worker_cores_for_goal"]]
            for v in r["shapes"].values()]
    print(table(f"one GPU's pool: {args.rounds} x {args.requests:,} requests of {PROMPT_TOKENS} "
                f"tokens, a zero-latency simulator ({SLOTS} slots), {SLOTS + 1} threads in all, "
                f"{psutil.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
                ["processes", "requests/s", "x one", "workers CPU ms / req",
                 "sim CPU ms / req", "workers' cores", "cores in all",
                 f"worker cores for {GOAL_PER_S}/s"], rows))
    if not args.no_save:
        save("gpu", r, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
