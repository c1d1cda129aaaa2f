"""Regression guard: the whole pipeline's CPU per row on a fixed prompt set, against the last
recorded figure.

A local fleet (embedded Valkey, simulated GPUs that answer at once, real Celery workers) with
the producer and the drainer in this process, on the same 2,000 prompts every time
(`write_uniform_prompts`, seed 0): the CPU seconds of every process (workers, simulator,
Valkey, producer + drainer) divided by the rows. CPU time, not wall time, so a shared machine
inflates it far less than it inflates seconds; to take out the rest (a slower machine, a
loaded one), the bench also times a fixed pure-Python workload (`calibrate`) in the same run
and compares rows in that unit.

The comparison is with `bench/figures/guard.json` as it was before this run: a row that costs
WARN_OVER more than the last recorded figure prints a warning, FAIL_OVER more fails the bench
(exit 1, and `make bench` with it) and leaves the recorded figure as it was, so the next run
still compares with the figure before the regression. `--accept` records it anyway (a cost
that was paid on purpose: say why in the commit).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench import ceiling, common
from bench.common import save, self_cpu_s, table

# Run-to-run spread of CPU per row on this 2-core machine under the other sessions' load: the
# worker bench's ratio moved by about +-0.1 on 0.8 (~12 %) between back-to-back runs
# (docs/performance.md). A warning past that spread, a failure past twice it.
WARN_OVER = 0.12
FAIL_OVER = 0.25
ROWS = 2000
GPUS = 2


def calibrate(rounds: int = 5) -> float:
    """CPU ms of a fixed pure-Python workload (JSON, dicts, strings: what the pipeline does),
    the median of `rounds`: the machine's unit for this run."""
    record = {"id": "r1", "completion": "word " * 200, "tokens": list(range(300)),
              "meta": {"a": 1.5, "b": [1, 2, 3]}}
    times = []
    for _ in range(rounds):
        started = self_cpu_s()
        for i in range(4000):
            data = orjson.dumps({**record, "line": i})
            back = orjson.loads(data)
            "|".join(str(t) for t in back["tokens"][:50])
        times.append(1000 * (self_cpu_s() - started))
    return sorted(times)[len(times) // 2]


def previous() -> dict[str, Any] | None:
    path = common.FIGURES_DIR / "guard.json"  # read at call time: tests move it
    if not path.exists():
        return None
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def verdict(now: float, before: float | None) -> tuple[str, float | None]:
    """'new', 'ok', 'warn' or 'fail', and now / before."""
    if not before:
        return "new", None
    ratio = now / before
    if ratio > 1 + FAIL_OVER:
        return "fail", ratio
    if ratio > 1 + WARN_OVER:
        return "warn", ratio
    return "ok", ratio


def run(rows: int, gpus: int, work: Path) -> dict[str, Any]:
    unit_before = calibrate()
    r = ceiling.run(rows, work, 200, gpus)
    unit_after = calibrate()
    if r["done"] != rows:
        raise RuntimeError(f"only {r['done']} of {rows} rows done")
    unit_ms = (unit_before + unit_after) / 2
    total_ms = sum(r["cpu_ms_per_row"].values())
    return {"rows": rows, "gpus": gpus, "slots": ceiling.SLOTS,
            "cpu_ms_per_row": total_ms, "cpu_ms_per_row_by_part": r["cpu_ms_per_row"],
            "calibration_ms": unit_ms, "calibration_ms_before_after": [unit_before, unit_after],
            "rows_per_calibration_unit": unit_ms / total_ms,
            "cost_in_units": total_ms / unit_ms, "rows_per_s": r["rows_per_s"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench guard", description=__doc__)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--gpus", type=int, default=GPUS)
    parser.add_argument("--accept", action="store_true",
                        help="record this run's figure even past the failure threshold")
    args = parser.parse_args(argv)
    last = previous()
    with tempfile.TemporaryDirectory(prefix="bench-guard-") as tmp:
        r = run(args.rows, args.gpus, Path(tmp))
    comparable = last is not None and last.get("rows") == args.rows and \
        last.get("gpus") == args.gpus
    before = last["cost_in_units"] if comparable and last is not None else None
    state, ratio = verdict(r["cost_in_units"], before)
    r.update(previous={k: last[k] for k in ("at", "commit", "cpu_ms_per_row", "cost_in_units")}
             if comparable and last is not None else None, verdict=state, over_previous=ratio)
    print(table(f"guard: whole-pipeline CPU per row, {args.rows:,} fixed prompts, {args.gpus} "
                f"zero-latency GPUs, load {os.getloadavg()[0]:.1f}",
                ["CPU ms / row", "calibration ms", "cost in units", "previous", "x previous",
                 "verdict"],
                [[r["cpu_ms_per_row"], r["calibration_ms"], r["cost_in_units"],
                  before if before is not None else "-",
                  ratio if ratio is not None else "-", state]]))
    print(table("CPU ms per row by part", list(r["cpu_ms_per_row_by_part"]),
                [[round(v, 3) for v in r["cpu_ms_per_row_by_part"].values()]]))
    if state == "fail" and not args.accept:
        print(f"\n!!! REGRESSION: a row costs {ratio:.2f} x the last recorded figure "
              f"({last['at'] if last else '?'}, commit {last['commit'] if last else '?'}), past "
              f"the {1 + FAIL_OVER:.2f} limit. bench/figures/guard.json is left as it was; "
              "find the cost, or rerun with `python -m bench guard --accept` to record it.\n",
              file=sys.stderr, flush=True)
        return 1
    if state == "warn":
        print(f"\n!!! WARNING: a row costs {ratio:.2f} x the last recorded figure (warning past "
              f"{1 + WARN_OVER:.2f}, failure past {1 + FAIL_OVER:.2f})\n", file=sys.stderr,
              flush=True)
    save("guard", r, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
