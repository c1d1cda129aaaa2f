"""Ordering study: does reordering the queue shorten the tail? Replays, many length draws.

The fleet bench runs one draw of answer lengths (the simulator's seed). Whether an order
helps is a question about the distribution, so this replays the fleet bench's prompts
under the simulator's own length model for many seeds, with a perfect zero-overhead
dispatcher (list scheduling), and compares orders: input order (what fleetgen does),
largest max_tokens first within each producer batch, the same over the whole run, and
longest service first, which needs an oracle (answer lengths are unknown before the run).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import save, table, write_varied_prompts
from bench.fleet import BATCH, CONTEXT, Model, list_schedule


def budgets(rows: int) -> list[int]:
    """max_tokens of each of the fleet bench's prompts, as the producer computes it."""
    from producer.budget import Limits, budget
    from producer.rows import Row, read_rows
    from producer.tokenizer import load_tokenizer

    tok = load_tokenizer("qwen3.6")
    with tempfile.TemporaryDirectory() as tmp:
        path = write_varied_prompts(Path(tmp) / "p.jsonl", rows)
        parsed = [r for r in read_rows(path) if isinstance(r, Row)]
        lengths = [len(ids) for ids in tok.encode_batch([tok.render(r.messages or [])
                                                         for r in parsed])]
    limits = Limits(context_length=CONTEXT)
    return [b.max_tokens for b in (budget(n, limits) for n in lengths) if not b.rejected]


def study(model: Model, max_tokens: list[int], seeds: int) -> dict[str, list[float]]:
    from fleetgen.simulator.model import natural_length

    slots = model.gpus * model.slots
    speeds, ends = [1.0] * slots, [float("inf")] * slots
    out: dict[str, list[float]] = {"input order": [], "max_tokens first, per batch": [],
                                    "max_tokens first, whole run": [],
                                    "oracle: longest first": []}
    for seed in range(seeds):
        rng = random.Random(seed)
        jobs = [(model.service_s(min(natural_length(rng, model.output_tokens_mean), m)), m)
                for m in max_tokens]
        ideal = sum(s for s, _ in jobs) / slots
        orders = {
            "input order": [s for s, _ in jobs],
            "max_tokens first, per batch": [
                s for i in range(0, len(jobs), BATCH)
                for s, _ in sorted(jobs[i:i + BATCH], key=lambda j: -j[1])],
            "max_tokens first, whole run": [s for s, _ in sorted(jobs, key=lambda j: -j[1])],
            "oracle: longest first": sorted((s for s, _ in jobs), reverse=True),
        }
        for name, services in orders.items():
            out[name].append(list_schedule(services, speeds, ends) / ideal)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ordering", description=__doc__)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--seeds", type=int, default=40)
    args = parser.parse_args(argv)
    model = Model()
    ratios = study(model, budgets(args.rows), args.seeds)
    rows = [[name, statistics.mean(v), statistics.median(v), sorted(v)[int(0.9 * len(v))],
             max(v)] for name, v in ratios.items()]
    print(table(f"ordering: makespan / ideal with a perfect dispatcher, {args.rows:,} prompts, "
                f"{args.seeds} draws of answer lengths, {model.gpus} GPUs x {model.slots} slots",
                ["order", "mean", "median", "p90", "worst"], rows))
    save("ordering", {"rows": args.rows, "seeds": args.seeds, "model": model.__dict__,
                      "ratios": ratios}, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
