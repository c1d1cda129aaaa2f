"""Drainer bench: lines/s from the run's stream to fsynced JSONL, at the drainer's fsync policy.

The stream is filled first with result entries shaped like a worker's (about 1.2 KB of
JSON each), then the real Drainer reads, writes, fsyncs once per batch and per file
touched, then XACKs and XDELs, until the run is complete.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import redis

from bench.common import save, table
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.queue.contract import KIND_RESULT
from fleetgen.records.outdir import OutputDir
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_PRODUCED


def fill(client: redis.Redis, run: str, rows: int) -> int:
    keys = RunKeys(run)
    size = 0
    for start in range(1, rows + 1, 1000):
        pipe = client.pipeline(transaction=False)
        for line in range(start, min(start + 1000, rows + 1)):
            record = {"id": f"r{line}", "line": line, "completion": "word " * 200,
                      "finish_reason": "stop", "prompt_tokens": 300,
                      "completion_tokens": 200, "max_tokens": 7890, "attempts": 1,
                      "worker": "gpu0@bench", "row": {"source": "bench"}}
            data = orjson.dumps(record)
            size = len(data)
            pipe.xadd(keys.stream, {"k": KIND_RESULT, "d": data})
        pipe.execute()
    client.hset(keys.manifest, mapping={"state": STATE_PRODUCED, "total": rows})
    return size


def measure(url: str, out: Path, rows: int, batch: int) -> dict[str, Any]:
    from fleetgen.drainer import Drainer
    from fleetgen.queue.redisconn import connect

    client = redis.Redis.from_url(url)
    client.flushall()
    run = f"drain{batch}"
    line_bytes = fill(client, run, rows)
    drainer = Drainer(connect(url), run, out / run, batch=batch, block_ms=10)
    drainer.recover()
    started = time.perf_counter()
    drainer.run_until_complete()
    seconds = time.perf_counter() - started
    drainer.close()
    written = sum(1 for _ in OutputDir(out / run).file(KIND_RESULT).open("rb"))
    if written != rows:
        raise RuntimeError(f"drainer wrote {written} lines, not {rows}")
    return {"rows": rows, "batch": batch, "seconds": seconds, "lines_per_s": rows / seconds,
            "line_bytes": line_bytes, "stream_left": int(client.xlen(RunKeys(run).stream)),
            "fsyncs": -(-rows // batch)}


def measure_restart(out: Path, rows: int) -> dict[str, Any]:
    """A restarted drainer rebuilds its tally from the output files: time that over an
    output of `rows` results (the model case: 654,676)."""
    from fleetgen.drainer import Tally, load_file

    path = out / "restart-results.jsonl"
    record: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * 300}],
                              "completion": "word " * 150, "finish_reason": "stop",
                              "prompt_tokens": 100, "completion_tokens": 150,
                              "max_tokens": 8000, "attempts": 1, "worker": "gpu0@bench"}
    with path.open("wb") as f:
        for line in range(1, rows + 1):
            record["id"], record["line"] = f"r{line}", line
            f.write(orjson.dumps(record) + b"\n")
    size = path.stat().st_size
    started = time.perf_counter()
    tally = Tally()
    load_file(path, KIND_RESULT, tally)
    seconds = time.perf_counter() - started
    if tally.written != rows:
        raise RuntimeError(f"tally rebuilt {tally.written} rows, not {rows}")
    path.unlink()
    return {"rows": rows, "bytes": size, "seconds": seconds}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench drainer", description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", default="512,64")
    parser.add_argument("--restart-rows", type=int, default=654_676,
                        help="results in the output a restarted drainer re-reads (654,676)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-drainer-") as tmp:
        work = Path(tmp)
        valkey = EmbeddedValkey(work / "valkey").start()
        try:
            results = [measure(valkey.url, work, args.rows, int(b))
                       for b in args.batches.split(",")]
        finally:
            valkey.stop()
        restart = measure_restart(work, args.restart_rows)
    print(table(f"drainer: {args.rows:,} results of ~{results[0]['line_bytes']} bytes, "
                "fsync per batch and file, then XACK + XDEL",
                ["batch (XREADGROUP COUNT)", "lines/s", "seconds", "fsyncs", "stream left"],
                [[r["batch"], r["lines_per_s"], r["seconds"], r["fsyncs"], r["stream_left"]]
                 for r in results]))
    print(table("drainer restart: rebuild what was written from the output files",
                ["results", "MB", "seconds"],
                [[restart["rows"], restart["bytes"] / 1e6, restart["seconds"]]]))
    save("drainer", {"results": results, "restart": restart}, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
