"""Bounded memory: producer peak RSS from 10 K to 1 M rows, Valkey used_memory over a long run.

Producer RSS: each size runs in a fresh child process against an embedded Valkey, with a
fixed high-water mark and a trivial consumer that pops the queue (so backpressure is live
and Redis stays small), and reports its own peak RSS. Valkey: a run of `--valkey-rows` rows
with a fast fake worker (pops a task, XADDs its result, sets its done bit, like the real
sink) and the real drainer (fsync, XDEL), sampling INFO used_memory as it goes.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.common import (
    CHILD,
    add_child,
    peak_rss_bytes,
    run_child,
    save,
    table,
    write_uniform_prompts,
)
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.queue.contract import KIND_RESULT, QUEUE
from fleetgen.runstate.keys import RunKeys

HIGH_WATER = 2048
SHORT_WORDS = 30  # ~60-token prompts: 1 M rows in about a minute; RSS is what is measured


class Popper(threading.Thread):
    """The trivial consumer: drops queued tasks as fast as Redis hands them out; with
    `fake_worker` it also records each as a result, as a worker's sink would."""

    def __init__(self, url: str, fake_worker: bool = False) -> None:
        super().__init__(daemon=True)
        self.redis = redis.Redis.from_url(url)
        self.fake_worker = fake_worker
        self.stop = threading.Event()
        self.count = 0

    def run(self) -> None:
        while not self.stop.is_set():
            batch: Any = self.redis.rpop(QUEUE, 500)
            if not batch:
                time.sleep(0.002)
                continue
            self.count += len(batch)
            if self.fake_worker:
                self._record(batch)

    def _record(self, batch: list[bytes]) -> None:
        import base64

        pipe = self.redis.pipeline(transaction=False)
        for raw in batch:
            payload = orjson.loads(base64.b64decode(orjson.loads(raw)["body"]))[0][0]
            keys = RunKeys(payload["run"])
            record = {"id": payload["id"], "line": payload["line"], "completion": "ok " * 50,
                      "finish_reason": "stop", "prompt_tokens": len(payload["input_ids"]),
                      "completion_tokens": 150, "max_tokens": payload["max_tokens"]}
            pipe.xadd(keys.stream, {"k": KIND_RESULT, "d": orjson.dumps(record)})
            pipe.setbit(keys.done, payload["line"], 1)
        pipe.execute()


def child(args: argparse.Namespace) -> None:
    """One producer run in this process; prints rows, seconds and peak RSS as JSON."""
    from producer.build import standalone_producer
    from producer.settings import ProducerSettings
    from producer.tokenizer import load_tokenizer

    settings = ProducerSettings(input=Path(args.input), run=args.run, redis_url=args.redis,
                                context_length=8192, high_water=HIGH_WATER)
    tokenizer = load_tokenizer("qwen3.6")
    load_peak = peak_rss_bytes()
    gc.collect()
    reset_peak_rss()  # what follows is the run itself, not the tokenizer build's peak
    before = rss_bytes("VmRSS")
    producer = standalone_producer(settings, tokenizer=tokenizer)
    started = time.perf_counter()
    progress = producer.send_pass()
    seconds = time.perf_counter() - started
    seen: Any = getattr(producer, "_seen_ids", None)
    seen_bytes = seen.nbytes() if hasattr(seen, "nbytes") else None
    print(json.dumps({"rows": progress.read, "enqueued": progress.enqueued, "seconds": seconds,
                      "run_peak_rss": rss_bytes("VmHWM"), "rss_before_run": before,
                      "load_peak_rss": load_peak, "seen_ids_bytes": seen_bytes}))


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


def rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def producer_rss(sizes: list[int], work: Path, valkey: EmbeddedValkey) -> list[dict[str, Any]]:
    big = write_uniform_prompts(work / "rss.jsonl", max(sizes), words=SHORT_WORDS)
    results = []
    for size in sizes:
        path = work / f"rss-{size}.jsonl"
        with big.open("rb") as src, path.open("wb") as dst:
            for _, line in zip(range(size), src, strict=False):
                dst.write(line)
        redis.Redis.from_url(valkey.url).flushall()
        popper = Popper(valkey.url)
        popper.start()
        try:
            out = run_child("bench.memory", input=path, redis=valkey.url, run=f"rss{size}")
        finally:
            popper.stop.set()
            popper.join()
        path.unlink()
        results.append(out)
    return results


def valkey_memory(rows: int, work: Path, valkey: EmbeddedValkey) -> dict[str, Any]:
    """used_memory sampled through a whole run of `rows` rows (producer, fake workers,
    real drainer), against the empty server's baseline."""
    from fleetgen.drainer import Drainer
    from fleetgen.queue.redisconn import connect

    client = redis.Redis.from_url(valkey.url)
    client.flushall()
    path = write_uniform_prompts(work / "vk.jsonl", rows)
    samples: list[int] = []
    base = int(client.info("memory")["used_memory"])
    popper = Popper(valkey.url, fake_worker=True)
    popper.start()
    producer = threading.Thread(target=run_child, daemon=True, args=("bench.memory",),
                                kwargs={"input": path, "redis": valkey.url, "run": "vk"})
    producer.start()
    drainer = Drainer(connect(valkey.url), "vk", work / "vk-out", block_ms=100)
    drainer.recover()
    last = [0.0]

    def sample(_: Drainer) -> None:
        if time.monotonic() - last[0] >= 0.25:
            last[0] = time.monotonic()
            samples.append(int(client.info("memory")["used_memory"]))

    started = time.perf_counter()
    try:
        for _ in drainer.ticks():
            sample(drainer)
    finally:
        drainer.close()
        popper.stop.set()
        popper.join()
    producer.join()
    seconds = time.perf_counter() - started
    final = int(client.info("memory")["used_memory"])
    return {"rows": rows, "written": drainer.tally.written, "seconds": seconds,
            "base_bytes": base, "peak_bytes": max(samples), "final_bytes": final,
            "samples": len(samples), "high_water": HIGH_WATER,
            "p50_bytes": sorted(samples)[len(samples) // 2]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench memory", description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--valkey-rows", type=int, default=200_000)
    add_child(parser, "input", "redis", "run")
    args = parser.parse_args(argv)
    if args.role == CHILD:
        child(args)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        valkey = EmbeddedValkey(work / "valkey").start()
        try:
            rss = producer_rss(sizes, work, valkey)
            vk = valkey_memory(args.valkey_rows, work, valkey)
        finally:
            valkey.stop()
    mib = 1 / (1 << 20)
    print(table("producer peak RSS (fresh process per size, high-water "
                f"{HIGH_WATER}, trivial consumer)",
                ["rows", "seconds", "rows/s", "RSS before run MiB", "peak RSS in run MiB",
                 "growth MiB", "seen-ids MiB", "peak in tokenizer load MiB"],
                [[r["rows"], r["seconds"], r["rows"] / r["seconds"], r["rss_before_run"] * mib,
                  r["run_peak_rss"] * mib, (r["run_peak_rss"] - r["rss_before_run"]) * mib,
                  (r["seen_ids_bytes"] or 0) * mib, r["load_peak_rss"] * mib] for r in rss]))
    print()
    print(table(f"Valkey used_memory through {vk['rows']:,} rows (fake workers, real drainer)",
                ["rows written", "seconds", "empty MiB", "median MiB", "peak MiB", "final MiB"],
                [[vk["written"], vk["seconds"], vk["base_bytes"] * mib, vk["p50_bytes"] * mib,
                  vk["peak_bytes"] * mib, vk["final_bytes"] * mib]]))
    save("memory", {"producer_rss": rss, "valkey": vk}, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
