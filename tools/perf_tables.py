"""Fill the performance tables in docs/performance.md and docs/scale.md from bench/figures/*.json.

Each table sits between `<!-- perf:NAME -->` and `<!-- /perf:NAME -->`; what is between the
markers is replaced, everything else is left as written. `--check` changes nothing and exits
1 when a file differs from what the figures give (run `python tools/perf_tables.py` to
update it). Every block ends with the run, date and commit its figures come from.

    python tools/perf_tables.py [--check] [--figures DIR] [FILE ...]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "bench" / "figures"
DOCS = (ROOT / "docs" / "performance.md", ROOT / "docs" / "scale.md")
BLOCK = re.compile(r"(<!-- perf:(?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- /perf:(?P=name) -->)",
                   re.DOTALL)

EXIT_OK, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2

Figures = dict[str, dict[str, Any]]
# The arguments that set a bench's size, named in each table's provenance.
SIZE_ARGUMENTS = ("rows", "max_tokens", "sizes", "valkey_rows", "restart_rows", "seeds", "gpus",
                  "fleets", "requests", "rounds", "processes", "consumers", "words")


def num(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def pct(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def md_table(header: Sequence[str], align: str, rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; `align` has one letter per column: l(eft) or r(ight)."""
    rule = ["---" if a == "l" else "---:" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def provenance(figs: Figures, names: Sequence[str]) -> str:
    """Which run, date and commit each figure comes from (runs differ when a bench ran alone)."""
    parts = []
    for name in names:
        f = figs[name]
        load = f["machine"].get("loadavg_1_5_15", [0.0])[0]
        sizes = ", ".join(f"{k} {v}" for k, v in f["arguments"].items()
                          if k in SIZE_ARGUMENTS and v is not None)
        parts.append(f"`{name}`: {f['run']}, {f['at'][:10]}, commit {_short(f['commit'])}, "
                     f"{sizes or 'default sizes'}, load {load:.1f} on {f['machine']['cpus']} "
                     "cores")
    return "<sub>From bench/figures/ — " + "; ".join(parts) + ".</sub>"


def _short(commit: str) -> str:
    head, dirty, _ = commit.partition("+")
    return head[:12] + (dirty + _)


def _fleet(figs: Figures) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["fleet"], r["system"]): r for r in figs["fleet"]["results"]}


def fleet_table(figs: Figures, name: str = "fleet") -> str:
    rows = [[r["fleet"], r["system"], str(r["in_flight_per_server"]), num(r["makespan_s"], 1),
             num(r["ideal_s"], 1), num(r["ratio_to_ideal"], 3), pct(r["utilization"]),
             num(r["completed"]), num(r["failed"]), num(r["context_length_failures"]),
             num(r["truncated"])] for r in figs[name]["results"]]
    return md_table(["fleet", "system", "in flight / server", "makespan s", "ideal s",
                     "× ideal", "utilization", "completed", "failed", "ctx-len 400s",
                     "truncated"], "llrrrrrrrrr", rows)


def _ratio_util(r: dict[str, Any]) -> str:
    return f"{r['ratio_to_ideal']:.3f}, {pct(r['utilization'])}"


def _seeds(runs: dict[tuple[str, str], dict[str, Any]], fleet: str) -> str:
    return "; ".join(f"{system}: {_ratio_util(r)}" for (f, system), r in runs.items()
                     if f == fleet and system.startswith("seed") and "rerun" not in system)


def fleet_summary(figs: Figures) -> list[list[str]]:
    runs = _fleet(figs)
    equal, half, dies = (runs[(f, "fleetgen")] for f in ("equal", "half-speed", "dies"))
    seed_k = runs[("equal", "seed, K")]
    replay = equal["replay"]["fifo_s"] / equal["ideal_s"]
    reruns = "; ".join(f"{system}: {r['ratio_to_ideal']:.3f}, {num(r['makespan_s'], 1)} s"
                       for (f, system), r in runs.items() if f == "dies" and "rerun" in system)
    lost = "; ".join(f"{system}: {num(r['failed'])} rows failed" for (f, system), r
                     in runs.items() if f == "dies" and system.startswith("seed")
                     and "rerun" not in system)
    ours_400 = sum(runs[(f, "fleetgen")]["context_length_failures"]
                   for f in ("equal", "half-speed", "dies"))
    return [
        ["fleet, all GPUs equal: makespan / ideal, utilization", f"**{_ratio_util(equal)}** "
         f"({_seeds(runs, 'equal')}; {num(seed_k['context_length_failures'])} seed rows lost "
         "to HTTP 400)", f"heavy-tailed answers up to {replay:.3f} (a perfect zero-overhead "
         "dispatcher in the same order); above that, fleetgen's dispatch overhead"],
        ["fleet, one GPU at half speed", f"**{_ratio_util(half)}** ({_seeds(runs, 'half-speed')})",
         "same"],
        ["fleet, one server SIGKILLed half-way", f"**{_ratio_util(dies)}**, "
         f"{num(dies['completed'])} / {num(dies['rows'])} rows in {num(dies['makespan_s'], 1)} s "
         f"({lost}; with a rerun of the lost rows {reruns})", "same"],
        ["context-length failures", f"**{num(ours_400)}** on three fleets (seed: "
         f"{num(seed_k['context_length_failures'])} of {num(seed_k['rows'])} on each)", "—"],
    ]


def other_summary(figs: Figures) -> list[list[str]]:
    naive, ours = figs["producer"]["results"]
    rss = figs["memory"]["producer_rss"]
    vk = figs["memory"]["valkey"]
    drained = {r["batch"]: r["lines_per_s"] for r in figs["drainer"]["results"]}
    batches = sorted(drained, reverse=True)
    ceil = figs["ceiling"]
    cpu = ceil["cpu_ms_per_row"]
    workers = next(v for k, v in cpu.items() if k.startswith("workers"))
    sizes = " → ".join(_count(r["rows"]) for r in rss)
    return [
        [f"producer, ~{figs['producer']['mean_prompt_tokens']:.0f}-token chat rows, Qwen3.6",
         f"**{num(ours['rate'])} prompts/s**, {figs['producer']['speedup']:.1f} × a naive "
         f"per-row loop ({num(naive['rate'])}/s)",
         "rendering the official chat template (110 µs a row), then tokenization; one process"],
        [f"producer peak RSS, {sizes} rows",
         "**" + " → ".join(f"{r['run_peak_rss'] / MIB:.0f}" for r in rss) + " MiB** (growth in "
         "the run " + " → ".join(f"{(r['run_peak_rss'] - r['rss_before_run']) / MIB:.1f}"
                                 for r in rss) + " MiB)",
         "the tokenizer (~490 MiB loaded); ids seen: 8 bytes a row"],
        [f"Valkey `used_memory` through {_count(vk['rows'])} rows",
         f"**{vk['base_bytes'] / MIB:.2f} MiB empty, {vk['p50_bytes'] / MIB:.2f} median, "
         f"{vk['peak_bytes'] / MIB:.2f} peak, {vk['final_bytes'] / MIB:.2f} at the end**",
         "high-water mark × message size, plus the drainer's lag"],
        ["drainer", f"**{num(drained[batches[0]])} lines/s** (batches of "
         f"{batches[0]}, fsync per batch)" + "".join(
             f"; {num(drained[b])} at batches of {b}" for b in batches[1:]),
         "fsync + orjson, one process"],
        ["ceiling (zero-latency GPUs, whole pipeline on this machine)",
         f"**{num(ceil['rows_per_s'])} rows/s** ≈ {num(ceil['gpus_fed'])} GPUs' worth",
         f"the cores: the Celery workers use {workers:.1f} ms CPU a row of "
         f"{sum(cpu.values()):.1f}"],
    ]


MIB = float(1 << 20)


def _count(rows: int) -> str:
    """10 K, 1 M: the sizes as the prose says them."""
    for unit, scale in (("M", 10**6), ("K", 10**3)):
        if rows >= scale and rows % scale == 0:
            return f"{rows // scale:,} {unit}"
    return f"{rows:,}"


def summary_table(figs: Figures) -> str:
    """The fleet's rows and the others' rows, each part only when its benches have run."""
    rows = fleet_summary(figs) if "fleet" in figs else []
    others = ("producer", "memory", "drainer", "ceiling")
    rows += other_summary(figs) if all(b in figs for b in others) else []
    rows += scale_summary(figs)
    missing = [b for b in SUMMARY if b not in figs]
    note = (f"\n\n*No figures yet from {', '.join(missing)}: bench/figures/ lacks "
            f"{', '.join(m + '.json' for m in missing)}.*") if missing else ""
    return md_table(["figure", "value", "what limits it"], "lll", rows) + note


SUMMARY = ("fleet", "producer", "memory", "drainer", "ceiling")
# Summary rows shown when their figures exist (issue 20's), named in the provenance then.
SUMMARY_EXTRA = ("fleet-equal", "worker", "gpu", "central", "guard")


def scale_summary(figs: Figures) -> list[list[str]]:
    rows = []
    if "fleet-equal" in figs:
        runs = {r["system"]: r for r in figs["fleet-equal"]["results"]}
        ours, seed1 = runs.get("fleetgen"), runs.get("seed, K+1")
        if ours and seed1:
            rows.append(["equal fleet re-measured: makespan / ideal",
                         f"**{ours['ratio_to_ideal']:.3f}** ({num(ours['makespan_s'], 1)} s; "
                         f"seed, K+1: {seed1['ratio_to_ideal']:.3f}, "
                         f"{num(seed1['makespan_s'], 1)} s, {num(seed1['failed'])} rows lost)",
                         "dispatch overhead under the machine's load (see its provenance)"])
    if "worker" in figs:
        w = figs["worker"]
        rows.append(["worker CPU per request (zero-latency engine)",
                     f"**{w['worker_cpu_ms_per_request']:.2f} ms**, "
                     f"{w['worker_over_client']:.2f} × a plain asyncio client's",
                     "Celery and kombu's per-message work, the Redis round trips "
                     "exactly-once needs"])
    if "gpu" in figs:
        shapes = figs["gpu"]["shapes"]
        rows.append(["one GPU's pool (zero-latency engine), by worker processes",
                     "**" + ", ".join(f"{v['processes']}: {num(v['requests_per_s'])}/s"
                                      for v in shapes.values()) + "**",
                     "this machine's 2 cores (workers, simulator and Valkey share them)"])
    if all(b in figs for b in ("central", "producer", "drainer")):
        capacity = scale_capacity(figs)
        first = min(capacity, key=lambda k: capacity[k])
        seed_rate = WORKLOADS[0][1]
        rows.append(["GPUs one producer + Valkey + drainer feed (docs/scale.md)",
                     f"**{num(capacity[first] / seed_rate)}** for the seed's workload, "
                     f"{num(capacity[first] / WORKLOADS[1][1])} for a small model's",
                     f"{first} ({num(capacity[first])} rows/s)"])
    if "guard" in figs:
        g = figs["guard"]
        rows.append(["whole-pipeline CPU per row (regression guard)",
                     f"**{g['cpu_ms_per_row']:.2f} ms** ({g['cost_in_units']:.3f} calibration "
                     "units)", "`make bench` fails past 1.25 × the last recorded figure"])
    return rows


def ordering_table(figs: Figures) -> str:
    rows = []
    for name, values in figs["ordering"]["ratios"].items():
        ranked = sorted(values)
        rows.append([name, f"{statistics.mean(values):.3f}", f"{statistics.median(values):.3f}",
                     f"{ranked[int(0.9 * len(ranked))]:.3f}", f"{ranked[-1]:.3f}"])
    return md_table(["order", "mean × ideal", "median", "p90", "worst"], "lrrrr", rows)


def producer_table(figs: Figures) -> str:
    rows = [[r["mode"], num(r["rate"]), num(r["seconds"], 2), f"{r['run_peak_rss'] / MIB:.0f} MiB"]
            for r in figs["producer"]["results"]]
    return md_table(["producer", "prompts/s", "seconds", "peak RSS in the run"], "lrrr", rows)


def memory_table(figs: Figures) -> str:
    rows = [[num(r["rows"]), num(r["rows"] / r["seconds"]),
             f"{r['rss_before_run'] / MIB:.1f} MiB", f"{r['run_peak_rss'] / MIB:.1f} MiB",
             f"{(r['run_peak_rss'] - r['rss_before_run']) / MIB:.1f} MiB",
             f"{(r['seen_ids_bytes'] or 0) / MIB:.1f} MiB"] for r in figs["memory"]["producer_rss"]]
    return md_table(["rows", "prompts/s", "RSS before run", "peak RSS in run", "growth",
                     "ids seen"], "rrrrrr", rows)


def valkey_table(figs: Figures) -> str:
    vk = figs["memory"]["valkey"]
    return md_table(["rows written", "seconds", "empty", "median", "peak", "at the end"],
                    "rrrrrr", [[num(vk["written"]), num(vk["seconds"], 1),
                                *(f"{vk[k] / MIB:.2f} MiB" for k in
                                  ("base_bytes", "p50_bytes", "peak_bytes", "final_bytes"))]])


def drainer_table(figs: Figures) -> str:
    d = figs["drainer"]
    rows = [[f"drain, batches of {r['batch']}", num(r["rows"]), num(r["lines_per_s"]),
             num(r["seconds"], 2)] for r in d["results"]]
    rs = d["restart"]
    rows.append([f"restart: re-read {rs['bytes'] / 1e6:,.0f} MB of output", num(rs["rows"]),
                 num(rs["rows"] / rs["seconds"]), num(rs["seconds"], 2)])
    return md_table(["what", "lines", "lines/s", "seconds"], "lrrr", rows)


def ceiling_table(figs: Figures) -> str:
    c = figs["ceiling"]
    cpu = "; ".join(f"{k} {v:.2f}" for k, v in c["cpu_ms_per_row"].items())
    return md_table(["rows", "rows/s", "GPUs fed", "CPU ms a row by part"], "rrrl",
                    [[num(c["rows"]), num(c["rows_per_s"]), num(c["gpus_fed"]), cpu]])


def worker_table(figs: Figures) -> str:
    w = figs["worker"]
    sim = w["simulator_cpu_ms_per_request"]
    rows = [["fleetgen worker (Celery, threads pool)", num(w["worker_cpu_ms_per_request"], 2),
             f"{w['worker_over_client']:.2f}", num(w["worker_requests_per_s"]),
             num(sim["worker phase"], 2)],
            ["plain asyncio client (httpx)", num(w["client_cpu_ms_per_request"], 2), "1.00",
             num(w["client_requests_per_s"]), num(sim["client phase"], 2)]]
    return md_table(["who sends the requests", "CPU ms / request", "× the plain client",
                     "requests/s", "simulator CPU ms / request"], "lrrrr", rows)


def gpu_table(figs: Figures) -> str:
    g = figs["gpu"]
    rows = [[str(v["processes"]), num(v["requests_per_s"]), f"{v['over_first']:.2f}",
             num(v["workers_cpu_ms_per_request"], 2), num(v["simulator_cpu_ms_per_request"], 2),
             num(v["valkey_cpu_ms_per_request"], 2), num(v["workers_cores_used"], 2),
             num(v["all_cores_used"], 2), num(v["worker_cores_for_goal"], 2)]
            for v in g["shapes"].values()]
    return md_table(["worker processes", "requests/s", "× one process", "workers CPU ms / req",
                     "simulator CPU ms / req", "Valkey CPU ms / req", "workers' cores used",
                     "cores used in all", f"worker cores for {g['goal_requests_per_s']}/s"],
                    "rrrrrrrrr", rows)


def central_table(figs: Figures) -> str:
    c = figs["central"]
    cpu = c["cpu_ms_per_row"]
    mem = c["valkey_memory_bytes"]
    return md_table(["rows", "consumers", "rows/s", "producer + drainer CPU ms / row",
                     "Valkey CPU ms / row", "consumers CPU ms / row", "Redis commands / row",
                     "bytes in / out per row", "Valkey peak"], "rrrrrrrrr",
                    [[num(c["rows"]), str(c["consumers"]), num(c["rows_per_s"]),
                      num(cpu["producer + drainer"], 3), num(cpu["valkey"], 3),
                      num(cpu["consumers"], 3), num(c["redis_commands_per_row_total"], 1),
                      f"{c['redis_bytes_in_per_row']:,.0f} / {c['redis_bytes_out_per_row']:,.0f}",
                      f"{mem['peak'] / (1 << 20):.1f} MiB"]])


def central_commands_table(figs: Figures) -> str:
    per_row = figs["central"]["redis_commands_per_row"]
    return md_table(["command", "per row"], "lr",
                    [[k.upper(), f"{v:.2f}"] for k, v in per_row.items() if v >= 0.05])


# docs/scale.md's two workloads. The seed's: 654,676 rows of a 27B-class model whose answers
# average ~2,710 tokens (523 M completion tokens over 193,010 answers, issue 42) at ~2,500
# generated tokens/s per GPU: ~0.92 rows/s per GPU. A small model's (1-8B, short answers): an
# assumption of 200 rows/s per GPU, the "hundreds of requests/s per GPU" of issue 20. In
# flight per GPU: K + 1 = 129.
SEED_ANSWER_TOKENS = 523e6 / 193_010
WORKLOADS = (("seed: 27B, ~2,700-token answers", 2500 / SEED_ANSWER_TOKENS),
             ("small model: 1-8B, short answers", 200.0))
IN_FLIGHT_PER_GPU = 129


def scale_capacity(figs: Figures) -> dict[str, float]:
    """Rows/s each central part sustains on one core (one process; Valkey's main thread)."""
    producer = figs["producer"]["results"][-1]
    drainer = figs["drainer"]["results"][0]
    return {"producer (one process)": producer["rate"],
            "drainer (one process)": drainer["lines_per_s"],
            "Valkey (one core)": 1000 / figs["central"]["cpu_ms_per_row"]["valkey"]}


def scale_table(figs: Figures) -> str:
    capacity = scale_capacity(figs)
    first = min(capacity, key=lambda k: capacity[k])
    header = ["central part", "rows/s it sustains",
              *[f"GPUs it feeds: {name} ({per_gpu:,.1f} rows/s a GPU)"
                for name, per_gpu in WORKLOADS]]
    rows = [[part + (" — runs out first" if part == first else ""), num(rate),
             *[num(rate / per_gpu) for _, per_gpu in WORKLOADS]]
            for part, rate in capacity.items()]
    return md_table(header, "lrrr", rows)


def scale_memory_table(figs: Figures) -> str:
    """Valkey memory held for a fleet: the queue at its high-water mark (2 x the fleet's
    concurrency) plus the unacked copies of what is in flight, at the central bench's measured
    task message size, for fleets of 100, 1,000 and 5,000 GPUs."""
    c = figs["central"]
    message = c["task_message_bytes"]
    rows = []
    for gpus in (100, 1000, 5000):
        in_flight = gpus * IN_FLIGHT_PER_GPU
        held = 3 * in_flight * message
        rows.append([num(gpus), num(in_flight), f"{held / (1 << 30):.2f} GiB"])
    return md_table(["GPUs", "prompts in flight", "queue + unacked in Valkey"], "rrr", rows) + \
        f"\n\nTask message: {message:,.0f} bytes ({c.get('prompt_tokens', 300)}-token prompts)."


# The bounds issue 42 sets for one Valkey at 1,000 workers.
SCALE_BOUNDS = {"busy": 0.5, "p99_ms": 10.0, "max_ms": 50.0}


def fleet_scale_table(figs: Figures, name: str = "fleet-scale") -> str:
    """Per N emulated workers: what Valkey did, measured, and its main thread scaled to the
    target row rate when the emulation (2 shared cores) fell short of it."""
    rows = []
    for r in figs[name]["results"]:
        ping = r["ping_ms"]
        rows.append([num(r["workers"]), num(r["in_flight"]),
                     f"{r['rows_per_s']:,.0f} of {r['rows_per_s_target']:,.0f}",
                     pct(r["valkey_main_thread_busy"]),
                     pct(_busy_at_target(r, figs["central"]["cpu_ms_per_row"]["valkey"])),
                     num(ping["p50"], 2), num(ping["p99"], 1), num(ping["max"], 1),
                     f"{r['valkey_memory_bytes']['peak'] / (1 << 20):,.0f} MiB",
                     f"{r['valkey_memory_bytes']['unacked_hash'] / (1 << 20):,.0f} MiB",
                     # "lines_in_flight": its name in the figures made before issue 43
                     num(r["operator_call_s"].get("slots_in_flight",
                                                  r["operator_call_s"].get("lines_in_flight")), 2),
                     num(r["operator_call_s"]["status"], 2)])
    placement = figs[name].get("placement", "unpinned")
    loads = ", ".join(f"{r['workers']:,}: {r['load_average']}" for r in figs[name]["results"]
                      if "load_average" in r)
    return md_table(["workers", "in flight", "rows/s (target)", "Valkey main thread",
                     "at the target rates (estimate)", "PING p50 ms", "p99 ms", "max ms",
                     "Valkey memory",
                     "unacked copies", "slots_in_flight s", "status s"], "rrrrrrrrrrrr", rows) + \
        f"\n\nPlacement: {placement}." + \
        (f" Load average (1, 5, 15 min) as each N's window opened: {loads}." if loads else "")


def fleet_scale_commands_table(figs: Figures) -> str:
    """Commands/s by command per N (INFO commandstats; a script's commands count one by one,
    its EVALSHA once), the ten busiest of the largest N, for every N."""
    results = figs["fleet-scale"]["results"]
    top = sorted(results[-1]["commands_per_s"].items(), key=lambda kv: -kv[1])[:10]
    return md_table(["command", *[f"{r['workers']:,} workers" for r in results]],
                    "l" + "r" * len(results),
                    [[k.upper(), *[num(r["commands_per_s"].get(k, 0.0)) for r in results]]
                     for k, _ in top])


def _busy_at_target(r: dict[str, Any], valkey_ms_per_row: float) -> float:
    """Valkey's main thread at the target rates, an upper estimate when the emulated workers
    (Python on 2 shared cores) fell short: the busy fraction measured, scaled by the share of
    the heartbeats they made (one EXPIRE a beat; beats are their first business), plus the
    rows they did not make at Valkey's cost of a row in the central bench."""
    beats = r["commands_per_s"].get("expire", 0.0) / (r["workers"] / 2.0)
    busy = float(r["valkey_main_thread_busy"]) / min(max(beats, 1e-9), 1.0)
    missing = max(r["rows_per_s_target"] - r["rows_per_s"], 0.0)
    return busy + missing * valkey_ms_per_row / 1000


def fleet_scale_road_table(figs: Figures) -> str:
    """A thousand GPUs as one Valkey, or as a Valkey per group of GPUs of each measured size:
    how many, and what each one carries (its figures at that N)."""
    rows = []
    for r in figs["fleet-scale"]["results"]:
        n = r["workers"]
        valkeys = -(-1000 // n)
        rows.append([f"a Valkey per {n:,} GPUs" if n < 1000 else "one Valkey", str(valkeys),
                     pct(_busy_at_target(r, figs["central"]["cpu_ms_per_row"]["valkey"])),
                     num(r["ping_ms"]["p99"], 1),
                     num(r["ping_ms"]["max"], 1),
                     f"{r['valkey_memory_bytes']['peak'] / (1 << 20):,.0f} MiB",
                     f"{r['rows_per_s_target']:,.0f}"])
    return md_table(["1,000 GPUs as", "Valkeys", "each one's main thread at its target",
                     "PING p99 ms", "max ms", "memory each", "rows/s each"], "lrrrrrr", rows)


def guard_table(figs: Figures) -> str:
    g = figs["guard"]
    parts = "; ".join(f"{k} {v:.2f}" for k, v in g["cpu_ms_per_row_by_part"].items())
    before = g.get("previous") or {}
    return md_table(["rows", "CPU ms / row, all processes", "calibration ms", "cost in units",
                     "× previous", "by part (ms / row)"], "rrrrrl",
                    [[num(g["rows"]), num(g["cpu_ms_per_row"], 2), num(g["calibration_ms"], 1),
                      num(g["cost_in_units"], 3),
                      f"{g['over_previous']:.2f} (of {before.get('at', '?')[:10]})"
                      if g.get("over_previous") else "first record", parts]])


def real_table(figs: Figures, name: str = "real") -> str:
    r = figs[name]
    best = r["best_plain"]
    rows = [[f"plain client, {p['concurrency']} in flight", num(p["makespan_s"], 1), "-",
             f"{p['makespan_s'] / best['makespan_s']:.3f}", str(p["concurrency"])]
            for p in r["plain"]]
    rows += [["`fleetgen run`" + (f" `--workers-per-engine {f['workers_per_engine']}`"
                                   if f["workers_per_engine"] > 1 else " (defaults)"),
              num(f["makespan_s"], 1), num(f["command_s"], 1), f"{f['ratio']:.3f}",
              f"{f['in_flight_settled']} (max {f['in_flight_max']})"] for f in r["fleetgen"]]
    return md_table(["client", "makespan s", "whole command s", "× best plain client",
                     "in flight"], "lrrrr", rows)


def real_rates_table(figs: Figures) -> str:
    rates = figs["real_rates"]["rates"]
    best = max(r["tokens_per_s"] for r in rates)
    rows = [[str(r["in_flight"]), num(r["tokens_per_s"], 1), f"{r['tokens_per_s'] / best:.3f}"]
            for r in rates]
    return md_table(["in flight", "tokens/s", "× the best"], "rrr", rows)


# block name -> (benches it reads, the function that renders it)
TABLES: dict[str, tuple[tuple[str, ...], Callable[[Figures], str]]] = {
    "summary": ((), summary_table),  # renders what there is, names what is missing
    "fleet": (("fleet",), fleet_table),
    "fleet-equal": (("fleet-equal",), lambda figs: fleet_table(figs, "fleet-equal")),
    "ordering": (("ordering",), ordering_table),
    "producer": (("producer",), producer_table),
    "memory": (("memory",), memory_table),
    "valkey": (("memory",), valkey_table),
    "drainer": (("drainer",), drainer_table),
    "ceiling": (("ceiling",), ceiling_table),
    "worker": (("worker",), worker_table),
    "gpu": (("gpu",), gpu_table),
    "central": (("central",), central_table),
    "central-commands": (("central",), central_commands_table),
    "guard": (("guard",), guard_table),
    "real": (("real",), real_table),
    "real-llama": (("real-llama",), lambda figs: real_table(figs, "real-llama")),
    "real-rates": (("real_rates",), real_rates_table),
    "scale": (("producer", "drainer", "central"), scale_table),
    "scale-memory": (("central",), scale_memory_table),
    "fleet-scale": (("fleet-scale", "central"), fleet_scale_table),
    "fleet-scale-before": (("fleet-scale-before", "central"),
                           lambda figs: fleet_scale_table(figs, "fleet-scale-before")),
    "fleet-scale-commands": (("fleet-scale",), fleet_scale_commands_table),
    "fleet-scale-road": (("fleet-scale", "central"), fleet_scale_road_table),
}


def load_figures(directory: Path) -> Figures:
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def render_block(name: str, figs: Figures) -> str:
    if name not in TABLES:
        raise KeyError(f"unknown table <!-- perf:{name} -->; known: {', '.join(TABLES)}")
    benches, render = TABLES[name]
    missing = [b for b in benches if b not in figs]
    if missing:
        # A bench not yet run (or not finished in the time a run had) says so in the docs.
        return (f"*No figures yet: bench/figures/ has no "
                f"{', '.join(m + '.json' for m in missing)} "
                f"(run `python -m bench {missing[0]}`).*\n")
    present = [b for b in benches or SUMMARY + SUMMARY_EXTRA if b in figs]
    return render(figs) + "\n\n" + provenance(figs, present) + "\n"


def fill(text: str, figs: Figures) -> str:
    """`text` with every marked block replaced by the table its figures give."""
    return BLOCK.sub(lambda m: m.group(1) + render_block(m.group("name"), figs) + m.group(4),
                     text)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools/perf_tables.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a file differs from the figures")
    parser.add_argument("--figures", type=Path, default=FIGURES)
    parser.add_argument("files", nargs="*", type=Path, default=list(DOCS))
    args = parser.parse_args(argv)
    figs = load_figures(args.figures)
    differs = []
    for path in args.files:
        text = path.read_text()
        try:
            new = fill(text, figs)
        except KeyError as exc:
            print(f"{path}: {exc.args[0]}", file=sys.stderr)
            return EXIT_ERROR
        if new == text:
            continue
        differs.append(path)
        if not args.check:
            path.write_text(new)
    for path in differs:
        verb = "differs from bench/figures (run python tools/perf_tables.py)" if args.check \
            else "updated"
        print(f"{path}: {verb}", file=sys.stderr if args.check else sys.stdout)
    return EXIT_DIFFERS if args.check and differs else EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
