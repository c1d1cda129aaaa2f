"""Measure `fleetgen report` on a large synthetic output directory: build time, peak memory and
the HTML's size (docs/performance.md "Export and report").

The directory is what the drainer writes for a seed-like run (8 workers, 8,192-token context,
prompts of ~300 tokens, thinking answers of ~770 tokens with their reasoning, a few failures
and rejections, outcomes spread over a night), lines as long as real ones (about 3.6 bytes of
text per output token); summary.json is counted by the drainer's own Tally. The report is built
by a child process (`python -m fleetgen report`), whose peak RSS is read from the kernel.

    .venv/bin/python tools/report_bench.py [--rows N ...] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fleetgen.drainer import Tally
from fleetgen.queue.contract import KIND_FAILURE, KIND_HOLDOUT, KIND_REJECTED, KIND_RESULT
from fleetgen.records.outdir import FILES, RUN_MARKER, SUMMARY

CONTEXT = 8192
WORKERS = [f"gpu{n}@node1" for n in range(8)]
TEXT = ("The answer follows from the definition; each step is checked against the "
        "previous one, and the result is stated plainly at the end. ") * 400


def write_synthetic(out: Path, rows: int, *, seed: int = 7, run: str = "synthetic",
                    night_s: float = 36_000.0) -> dict[str, Any]:
    """Write a drained output directory of `rows` requests; returns its summary."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_MARKER).write_text(run + "\n")
    prompt = np.minimum(rng.lognormal(5.5, 0.6, rows).astype(np.int64) + 20, 9000)
    wanted = rng.lognormal(6.4, 0.7, rows).astype(np.int64) + 5
    fate = rng.random(rows)
    started = 1_790_000_000.0
    at = np.sort(rng.uniform(0, night_s, rows)) + started
    tally = Tally()
    files = {kind: (out / FILES[kind]).open("wb") for kind in FILES}
    try:
        for line in range(1, rows + 1):
            i = line - 1
            kind, record = _record(line, int(prompt[i]), int(wanted[i]), float(fate[i]),
                                   float(at[i]))
            files[kind].write(orjson.dumps(record) + b"\n")
            tally.add(kind, record)
    finally:
        for f in files.values():
            f.close()
    summary = {
        "run": run, "total": rows, "done": tally.by_kind[KIND_RESULT],
        "failed": tally.by_kind[KIND_FAILURE], "rejected": tally.by_kind[KIND_REJECTED],
        "holdout": tally.by_kind[KIND_HOLDOUT],
        "truncated": tally.truncated, "prompt_tokens": tally.prompt_tokens,
        "completion_tokens": tally.completion_tokens, **tally.quality, "complete": True,
        "stopped": None, "started_at": started, "finished_at": started + night_s,
        "wall_s": night_s, "rows_per_s": round(rows / night_s, 2),
        "completion_tokens_per_s": round(tally.completion_tokens / night_s, 1),
        "settings": {"tokenizer": "qwen3.6", "reasoning": "auto", "n": 1,
                     "context_length": CONTEXT, "max_output_tokens": None,
                     "sampling": {"temperature": 0.7, "top_p": 0.95}},
    }
    (out / SUMMARY).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n")
    return summary


def _record(line: int, prompt: int, wanted: int, fate: float, at: float
            ) -> tuple[str, dict[str, Any]]:
    row_id = f"row-{line:08d}"
    if 0.001 <= fate < 0.004:
        prompt += CONTEXT  # a row far too long for the context
    if prompt >= CONTEXT - 6:
        return KIND_REJECTED, {"id": row_id, "reason": f"prompt_too_long: {prompt} tokens, the "
                               f"input limit is {CONTEXT - 6}", "line": line,
                               "prompt_tokens": prompt}
    if fate < 0.001:
        return KIND_REJECTED, {"id": f"bad-{line}", "reason": "invalid_json: unexpected "
                               "character at column 12", "line": line}
    worker = WORKERS[line % len(WORKERS)]
    budget = CONTEXT - prompt - 2
    if fate > 0.998:
        status = 400 if fate > 0.9995 else None
        error = ({"type": "permanent", "message": "Requested token count exceeds the model's "
                  "maximum context length", "status": 400} if status else
                 {"type": "retryable", "message": "timed out after 900 s", "status": None})
        return KIND_FAILURE, {"id": row_id, "error": error, "attempts": 5, "max_tokens": budget,
                              "prompt_tokens": prompt, "worker": worker, "line": line,
                              "finished_at": round(at, 3)}
    tokens = min(wanted, budget)
    thought = int(tokens * (0.3 + 0.6 * fate)) if tokens < budget else tokens
    unfinished = thought >= tokens
    answer_chars = int(3.6 * (tokens - thought))
    return KIND_RESULT, {
        "messages": [{"role": "user", "content": TEXT[: 4 * prompt]}],
        "id": row_id, "completion": "" if unfinished else TEXT[:answer_chars],
        "finish_reason": "length" if tokens == budget else "stop",
        "prompt_tokens": prompt, "completion_tokens": tokens, "cached_tokens": 0,
        "max_tokens": budget, "latency_s": round(tokens * 0.02, 4), "attempts": 1,
        "worker": worker, "line": line, "finished_at": round(at, 3),
        "reasoning": TEXT[: int(3.6 * thought)], "reasoning_tokens": thought,
        "reasoning_unfinished": unfinished}


# Peak RSS of a child as the kernel counts it includes the image it was forked from (a
# forked process keeps its parent's high-water mark through exec), and this process holds the
# writer's arrays: so the report runs as the child of a small intermediate Python, which
# prints its child's peak.
_PEAK_OF_CHILD = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
                  "stdout=subprocess.DEVNULL); "
                  "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def measure(out: Path) -> dict[str, Any]:
    """Build the report in a clean child process: seconds, its peak RSS, HTML bytes."""
    start = time.perf_counter()
    peak_kib = int(subprocess.run(
        [sys.executable, "-c", _PEAK_OF_CHILD, sys.executable, "-m", "fleetgen", "report",
         str(out)], check=True, capture_output=True, text=True).stdout)
    seconds = time.perf_counter() - start
    html = (out / "report.html").stat().st_size
    data = sum((out / FILES[k]).stat().st_size for k in FILES)
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(peak_kib / 1024, 1),
            "html_bytes": html, "data_bytes": data}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--dir", type=Path, help="where to write (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic directories")
    args = parser.parse_args(argv)
    base = args.dir or Path(tempfile.mkdtemp(prefix="fleetgen-report-bench-"))
    for rows in args.rows:
        out = base / f"rows-{rows}"
        start = time.perf_counter()
        write_synthetic(out, rows)
        wrote = time.perf_counter() - start
        figures = measure(out)
        print(f"{rows:>9,} rows  data {figures['data_bytes'] / 2**20:,.0f} MiB (written in "
              f"{wrote:.0f} s)  report built in {figures['seconds']} s, peak RSS "
              f"{figures['peak_rss_mib']} MiB, HTML {figures['html_bytes'] / 1024:.0f} KiB",
              flush=True)
        if not args.keep:
            shutil.rmtree(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
