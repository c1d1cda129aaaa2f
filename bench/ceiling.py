"""Ceiling bench: rows/s through the whole pipeline when the GPUs cost nothing.

8 simulated servers with zero time to first token and zero time per token, 8 Celery
workers, embedded Valkey, producer and drainer, all on this machine. What is left is the
orchestration's own cost; the CPU seconds each part used say which one limits it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import save, self_cpu_s, table, write_uniform_prompts
from fleetgen.local.fleet import FleetSpec, LocalFleet
from fleetgen.local.simgpus import SimGpus
from fleetgen.queue.redisconn import connect

GPUS = 8
SLOTS = 32
# The model case, for "how many GPUs": 654,676 prompts and about half a billion output
# tokens is ~760 tokens a row; a GPU serving a mid-size model at ~2,500 generated tokens/s
# (batched) then finishes ~3.3 rows/s. An assumption, stated so the division can be redone.
GPU_TOKENS_PER_S = 2500
TOKENS_PER_ROW = 760


def cpu_s(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system + t.children_user + t.children_system)


def run(rows: int, work: Path, output_tokens_mean: int, gpus: int) -> dict[str, Any]:
    from fleetgen.drainer import Drainer
    from producer.build import standalone_producer
    from producer.settings import ProducerSettings
    from producer.tokenizer import load_tokenizer

    prompts = write_uniform_prompts(work / "prompts.jsonl", rows)
    tokenizer = load_tokenizer("qwen3.6")
    fleet = LocalFleet(work / "fleet", FleetSpec(), servers=SimGpus(
        gpus=gpus, max_running_requests=SLOTS, ttft_ms=0, tpot_ms=0,
        output_tokens_mean=output_tokens_mean))
    fleet.start()
    try:
        settings = ProducerSettings(input=prompts, run="ceiling", redis_url=fleet.redis_url,
                                    context_length=8192)
        producer = standalone_producer(settings, tokenizer=tokenizer)
        drainer = Drainer(connect(fleet.redis_url), "ceiling", work / "out", block_ms=50)
        drainer.recover()
        pids = {c.name: c.proc.pid for c in fleet.procs.children}
        assert fleet.valkey.proc is not None
        pids["valkey"] = fleet.valkey.proc.pid
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        self_before = self_cpu_s()
        started = time.perf_counter()
        thread = threading.Thread(target=producer.send_pass, daemon=True)
        thread.start()
        drainer.run_until_complete()
        seconds = time.perf_counter() - started
        thread.join()
        drainer.close()
        used = {name: cpu_s(pid) - before[name] for name, pid in pids.items()}
        used["producer + drainer (bench process)"] = self_cpu_s() - self_before
        summary = drainer.write_summary()
    finally:
        fleet.stop()
    workers = sum(v for k, v in used.items() if k.startswith("gpu"))
    parts = {f"workers ({gpus} Celery processes)": workers, "simulators": used.get("sim", 0.0),
             "valkey": used["valkey"],
             "producer + drainer": used["producer + drainer (bench process)"]}
    return {"rows": rows, "done": summary["done"], "seconds": seconds,
            "rows_per_s": rows / seconds, "cpu_s": parts,
            "cpu_ms_per_row": {k: 1000 * v / rows for k, v in parts.items()},
            "gpus_fed": rows / seconds / (GPU_TOKENS_PER_S / TOKENS_PER_ROW)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ceiling", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--output-tokens-mean", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=GPUS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as tmp:
        r = run(args.rows, Path(tmp), args.output_tokens_mean, args.gpus)
    if r["done"] != args.rows:
        raise RuntimeError(f"only {r['done']} of {args.rows} rows done")
    print(table(f"ceiling: {args.rows:,} rows of ~300 prompt tokens, zero-latency simulators, "
                f"{args.gpus} workers x -c {SLOTS}, all on {psutil.cpu_count()} cores",
                ["rows/s", "seconds", "GPUs one Redis + this machine can feed"],
                [[r["rows_per_s"], r["seconds"], r["gpus_fed"]]]))
    print(table("CPU per row (ms) by part", list(r["cpu_ms_per_row"]),
                [[round(v, 2) for v in r["cpu_ms_per_row"].values()]]))
    save("ceiling", {**r, "gpus": args.gpus, "slots": SLOTS,
                     "assumption": {"gpu_tokens_per_s": GPU_TOKENS_PER_S,
                                    "tokens_per_row": TOKENS_PER_ROW}}, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
