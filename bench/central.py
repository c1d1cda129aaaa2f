"""The central path's ceiling: producer + Valkey + drainer, fed by as many lightweight consumers
as the cores allow, and what one row costs each central part (docs/scale.md).

The consumers stand in for the GPUs' workers without Celery or HTTP: each is a process that
takes and acks a task through the worker's own broker code (fleetgen/queue/broker.py: a kombu
consumer on fleetgen's transport, so the take is its script into the holder's taking list,
`QoS.append` its record, `QoS.ack` the hold-only ack script on the acks thread) and runs the
worker's own `generate_one` with the real `StreamSink` (the done-bit check, the outcome's
script) against an engine that answers at once with a fixed answer. The
producer (in a thread) and the drainer run in this process as in the ceiling bench. Measured:
rows/s; CPU per row of the producer + drainer, Valkey and the consumers; Valkey's commands and
network bytes per row (`INFO commandstats`, `INFO stats`) and its memory through the run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

from bench.common import save, self_cpu_s, table, write_uniform_prompts
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.queue.contract import QUEUE
from fleetgen.queue.redisconn import connect
from fleetgen.records.outcomes import Generation

STOP_KEY = "bench:central:stop"
BYTES_KEY, TAKEN_KEY = "bench:central:message-bytes", "bench:central:messages"
ANSWER_WORDS = 150  # ~200 tokens of answer, as the other benches' simulators give


class InstantEngine:
    """An engine that answers every prompt at once with the same text."""

    base_url = "instant://"

    def __init__(self, words: int) -> None:
        self._text = " ".join(["token"] * words)
        self._tokens = int(words * 1.3)

    @property
    def rule(self) -> Any:
        raise AssertionError("never corrected: no error is raised")

    def generate(self, input_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                 rid: str, options: Any = None) -> Generation:
        return Generation(text=self._text, finish_reason="stop", prompt_tokens=len(input_ids),
                          completion_tokens=self._tokens, cached_tokens=0, latency_s=0.0)

    def healthy(self) -> bool:
        return True

    def close(self) -> None:
        pass


def consumer(url: str, name: str, words: int) -> None:
    """One lightweight worker: the worker's take, record and ack (a kombu consumer on
    fleetgen's transport, prefetch 1), the worker's own outcome path."""
    from kombu import Connection, Consumer, Queue

    from fleetgen.engine.decision import RetryPolicy
    from fleetgen.queue.broker import Transport, use_orjson_decoder
    from fleetgen.queue.celeryconf import celery_config
    from fleetgen.queue.contract import worker_queue
    from workers.generate import generate_one
    from workers.sink import StreamSink

    use_orjson_decoder()  # as the worker's app does (fleetgen/queue/celeryconf.py)
    options = celery_config(url, visibility_timeout_s=60)["broker_transport_options"]
    client = connect(url)
    sink = StreamSink(client, worker=name)
    engine = InstantEngine(words)
    policy = RetryPolicy()
    counts = {"taken": 0, "sampled": 0, "bytes": 0}

    def on_task(body: Any, message: Any) -> None:
        counts["taken"] += 1
        if counts["taken"] % 64 == 1:  # the message's size, sampled: no command of the path
            counts["sampled"] += 1
            counts["bytes"] += len(orjson.dumps(message._raw))
        generate_one(body[0][0], engine, sink, policy, worker=name)
        message.ack()

    # The worker consumes the shared queue and its own (workers/gate.py); its take names both.
    queues = [Queue(QUEUE), Queue(worker_queue(name))]
    with Connection(url, transport=Transport, transport_options=options) as conn, \
            Consumer(conn, queues, callbacks=[on_task], accept=["json"], prefetch_count=1):
        next_look = 0.0
        while True:
            # The stop flag is read once a second, not per task: it is no command of the path.
            if time.monotonic() >= next_look:
                if client.exists(STOP_KEY):
                    break
                next_look = time.monotonic() + 1.0
            try:
                conn.drain_events(timeout=1)
            except TimeoutError:
                continue
    # Closed: the acks given have reached Valkey (`Channel.close`).
    client.incrby(BYTES_KEY, counts["bytes"] * counts["taken"] // max(1, counts["sampled"]))
    client.incrby(TAKEN_KEY, counts["taken"])


def _cpu_s(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def _commands(client: Any) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in client.info("commandstats").items()}


def _net(client: Any) -> tuple[int, int]:
    s = client.info("stats")
    return int(s["total_net_input_bytes"]), int(s["total_net_output_bytes"])


def run(rows: int, consumers: int, work: Path, words: int) -> dict[str, Any]:
    from fleetgen.drainer import Drainer
    from producer.build import standalone_producer
    from producer.settings import ProducerSettings
    from producer.tokenizer import load_tokenizer

    prompts = write_uniform_prompts(work / "prompts.jsonl", rows)
    tokenizer = load_tokenizer("qwen3.6")
    valkey = EmbeddedValkey(work / "valkey").start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        client = connect(valkey.url)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        procs = [subprocess.Popen([sys.executable, "-m", "bench.central", "consumer",
                                   "--redis", valkey.url, "--name", f"c{i}@bench",
                                   "--words", str(words)], env=env)
                 for i in range(consumers)]
        settings = ProducerSettings(input=prompts, run="central", redis_url=valkey.url,
                                    context_length=8192)
        producer = standalone_producer(settings, tokenizer=tokenizer)
        drainer = Drainer(connect(valkey.url), "central", work / "out", block_ms=50)
        drainer.recover()
        assert valkey.proc is not None
        pids = {"valkey": [valkey.proc.pid], "consumers": [p.pid for p in procs]}
        memory: list[int] = []
        last = [0.0]

        def sample(_: Any) -> None:
            if time.monotonic() - last[0] >= 0.25:
                last[0] = time.monotonic()
                memory.append(int(client.info("memory")["used_memory"]))

        base_memory = int(client.info("memory")["used_memory"])
        client.config_resetstat()
        before = {k: sum(_cpu_s(p) for p in v) for k, v in pids.items()}
        self_before = self_cpu_s()
        started = time.perf_counter()
        thread = threading.Thread(target=producer.send_pass, daemon=True)
        thread.start()
        for _ in drainer.ticks():
            sample(drainer)
        seconds = time.perf_counter() - started
        thread.join()
        drainer.close()
        used = {k: sum(_cpu_s(p) for p in v) - before[k] for k, v in pids.items()}
        used["producer + drainer"] = self_cpu_s() - self_before
        commands = _commands(client)
        net_in, net_out = _net(client)
        written = drainer.tally.written
        client.set(STOP_KEY, 1)
        for p in procs:
            p.wait(timeout=60)
        message_bytes = int(client.get(BYTES_KEY) or 0) / max(1, int(client.get(TAKEN_KEY) or 0))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        valkey.stop()
    return {"rows": rows, "written": written, "consumers": consumers, "seconds": seconds,
            "rows_per_s": rows / seconds,
            "cpu_ms_per_row": {k: 1000 * v / rows for k, v in used.items()},
            "redis_commands_per_row": {k: v / rows for k, v in sorted(commands.items())
                                       if v / rows >= 0.01},
            "redis_commands_per_row_total": sum(commands.values()) / rows,
            "redis_bytes_in_per_row": net_in / rows, "redis_bytes_out_per_row": net_out / rows,
            "valkey_memory_bytes": {"empty": base_memory, "peak": max(memory or [0]),
                                    "median": sorted(memory)[len(memory) // 2] if memory else 0},
            "task_message_bytes": message_bytes, "prompt_tokens": 300, "answer_words": words}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench central", description=__doc__)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "consumer"])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--words", type=int, default=ANSWER_WORDS,
                        help="answer length in words (~1.3 tokens each)")
    parser.add_argument("--redis", help="consumer mode: the Valkey URL")
    parser.add_argument("--name", default="c0@bench", help="consumer mode: its worker name")
    args = parser.parse_args(argv)
    if args.mode == "consumer":
        consumer(args.redis, args.name, args.words)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-central-") as tmp:
        r = run(args.rows, args.consumers, Path(tmp), args.words)
    if r["written"] != args.rows:
        raise RuntimeError(f"only {r['written']} of {args.rows} rows written")
    print(table(f"central path: {args.rows:,} rows of ~300 prompt tokens, {args.consumers} "
                f"lightweight consumers, {psutil.cpu_count()} cores, "
                f"load {os.getloadavg()[0]:.1f}",
                ["rows/s", "seconds", "Redis commands / row", "bytes in / row",
                 "bytes out / row", "Valkey peak MiB"],
                [[r["rows_per_s"], r["seconds"], r["redis_commands_per_row_total"],
                  r["redis_bytes_in_per_row"], r["redis_bytes_out_per_row"],
                  r["valkey_memory_bytes"]["peak"] / (1 << 20)]]))
    print(table("CPU ms per row by part", list(r["cpu_ms_per_row"]),
                [[round(v, 3) for v in r["cpu_ms_per_row"].values()]]))
    print("Redis commands per row:", ", ".join(
        f"{k} {v:.2f}" for k, v in r["redis_commands_per_row"].items()))
    save("central", r, {k: v for k, v in vars(args).items() if k in ("rows", "consumers",
                                                                      "words")})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
