"""Producer bench: fleetgen's producer against a naive per-row loop, same rows, same Valkey.

Both read ~300-token chat rows (Qwen3.6 tokenizer) from a JSONL file and enqueue one Celery
task per row into an embedded Valkey. fleetgen: `Producer.send_pass()` (batched render + tiktoken
encode, exact budget, hand-built protocol-2 messages LPUSHed in one MULTI per batch, resume
bitmaps). Naive: per row `apply_chat_template(tokenize=True)` + `app.send_task`. Each runs
in a fresh process; peak RSS is measured over the run only (the tokenizer load is excluded
and reported apart). No consumer: the high-water mark is set above the row count.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.common import CHILD, add_child, run_child, save, table, write_uniform_prompts
from bench.memory import reset_peak_rss, rss_bytes
from fleetgen.local.valkey import EmbeddedValkey

CONTEXT = 8192


def run_fleetgen(path: Path, url: str, tokenizer: Any) -> int:
    from producer.build import standalone_producer
    from producer.settings import ProducerSettings

    settings = ProducerSettings(input=path, run="fleetgen", redis_url=url,
                                context_length=CONTEXT, high_water=10**9)
    producer = standalone_producer(settings, tokenizer=tokenizer)
    return producer.send_pass().enqueued


def run_naive(path: Path, url: str, tokenizer: Any) -> int:
    """The per-row loop a first script writes: render+tokenize one row, send one task."""
    import orjson

    from fleetgen.queue.celeryconf import make_app
    from fleetgen.queue.contract import QUEUE, TASK_NAME
    from producer.budget import Limits, budget

    app = make_app(url, visibility_timeout_s=3600)
    # A first script's Celery has kombu's own Redis transport, not fleetgen's (one client per
    # channel, fleetgen/queue/broker.py), which would make each of its publishes cheaper.
    app.conf.broker_transport = None
    limits = Limits(context_length=CONTEXT)
    hf = tokenizer.hf
    sent = 0
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            row = orjson.loads(raw)
            ids = list(hf.apply_chat_template(row["messages"], tokenize=True,
                                              add_generation_prompt=True)["input_ids"])
            b = budget(len(ids), limits)
            payload = {"run": "naive", "line": line_no, "id": row["id"], "input_ids": ids,
                       "max_tokens": b.max_tokens, "sampling": {}, "row": {}}
            app.send_task(TASK_NAME, args=[payload], queue=QUEUE)
            sent += 1
    app.close()
    return sent


def child(args: argparse.Namespace) -> None:
    from producer.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("qwen3.6")
    gc.collect()
    reset_peak_rss()
    before = rss_bytes("VmRSS")
    run = run_fleetgen if args.mode == "fleetgen" else run_naive
    started = time.perf_counter()
    count = run(Path(args.input), args.redis, tokenizer)
    seconds = time.perf_counter() - started
    print(json.dumps({"mode": args.mode, "rows": count, "seconds": seconds,
                      "rss_before_run": before, "run_peak_rss": rss_bytes("VmHWM"),
                      "mean_prompt_tokens": mean_prompt_tokens(Path(args.input), tokenizer)}))


def mean_prompt_tokens(path: Path, tok: Any, sample: int = 500) -> float:
    from producer.rows import Row, read_rows

    rows = [r for _, r in zip(range(sample), read_rows(path), strict=False)
            if isinstance(r, Row) and r.messages]
    ids = tok.encode_batch([tok.render(r.messages or []) for r in rows])
    return sum(map(len, ids)) / len(ids)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench producer", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000)
    child_parser = add_child(parser, "input", "redis")
    child_parser.add_argument("--mode", choices=("fleetgen", "naive"), required=True)
    args = parser.parse_args(argv)
    if args.role == CHILD:
        child(args)
        return 0

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-producer-") as tmp:
        work = Path(tmp)
        path = write_uniform_prompts(work / "prompts.jsonl", args.rows)
        valkey = EmbeddedValkey(work / "valkey").start()
        try:
            for mode in ("naive", "fleetgen"):
                redis.Redis.from_url(valkey.url).flushall()
                out = run_child("bench.produce", mode=mode, input=path, redis=valkey.url)
                queued = int(redis.Redis.from_url(valkey.url).llen("fleetgen"))
                if queued != args.rows:
                    raise RuntimeError(f"{mode}: {queued} messages queued, not {args.rows}")
                results.append({**out, "rate": out["rows"] / out["seconds"]})
        finally:
            valkey.stop()
    naive, ours = results
    tokens = ours["mean_prompt_tokens"]
    mib = 1 / (1 << 20)
    print(table(f"producer: {args.rows:,} chat rows, {tokens:.0f} prompt tokens mean "
                "(Qwen3.6), into Valkey",
                ["producer", "prompts/s", "seconds", "peak RSS in run MiB", "RSS growth MiB"],
                [[r["mode"], r["rate"], r["seconds"], r["run_peak_rss"] * mib,
                  (r["run_peak_rss"] - r["rss_before_run"]) * mib] for r in results]))
    print(f"fleetgen / naive: {ours['rate'] / naive['rate']:.1f}x")
    save("producer", {"rows": args.rows, "mean_prompt_tokens": tokens, "results": results,
                      "speedup": ours["rate"] / naive["rate"]}, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
