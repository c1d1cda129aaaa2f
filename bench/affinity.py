"""Affinity bench: `--turns all` on conversations with long histories, on 8 simulated GPUs whose
prefill costs what it costs (fleetgen/simulator: uncached prompt tokens at a prefill rate, in
chunks, holding up the running batch), with prefix affinity on against off, in the same run.

Figures: prompt tokens computed (the simulators' own count of uncached prompt tokens), the
share of later turns' prompt tokens served from cache, and the makespan. The prefill rate is
a real GPU's (8,000 tokens/s for a 27B model on one H100, docs/simulator.md) scaled by the
fleet's speed-up of decoding (a real 27B decodes at ~20 ms a token; the bench's GPUs at
Model.tpot_ms), so prefill weighs against decoding as it does on the real GPU; the KV pool, what
the prefix cache holds, a real GPU's (KV_TOKENS).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import save, table
from bench.fleet import CONTEXT, Fleet, Model, spec
from bench.turns import run_all_turns
from fleetgen.local.fleet import LocalFleet

REAL_PREFILL_TOKENS_PER_S = 8000.0
REAL_TPOT_MS = 20.0
# A GPU's KV pool, what its prefix cache can hold: a 27B model on an 80 GB GPU keeps some
# 250,000 tokens of KV (the simulator's own default, slots x context, is 16,384 at the bench's
# 2 slots: a cache no real server is that small).
KV_TOKENS = 262_144
# The product's 2 s wait in a worker's queue, on the bench's time scale (its GPUs decode
# REAL_TPOT_MS / Model.tpot_ms = 40 x faster than a real one).
AFFINITY_WAIT_S = 0.05
WORDS = ["tide", "prime", "recipe", "lifetime", "empire", "jazz", "compiler", "bee", "chess",
         "river", "proof", "kernel", "harbour", "violin", "glacier", "lattice"]


def write_conversations(path: Path, count: int, turns: int, words: int, seed: int = 0) -> int:
    """`count` conversations of `turns` long user turns each; returns the number of turns."""
    rng = random.Random(seed)
    with path.open("wb") as f:
        for i in range(count):
            messages: list[dict[str, str]] = []
            for k in range(turns):
                text = " ".join(rng.choice(WORDS) for _ in range(words))
                messages += [{"role": "user", "content": f"Turn {k + 1} of {i}: {text}"},
                             {"role": "assistant", "content": "an original answer"}]
            f.write(orjson.dumps({"id": f"conv{i}", "messages": messages}) + b"\n")
    return count * turns


def sim_totals(local: LocalFleet) -> dict[str, float]:
    keys = ("prefill_tokens_total", "cached_tokens_total")
    totals = dict.fromkeys(keys, 0.0)
    for gpu in range(local.spec.gpus):
        stats = httpx.get(local.engine_url(gpu) + "/_sim/stats", timeout=10).json()
        for key in keys:
            totals[key] += float(stats.get(key, 0))
    return totals


def run_fleetgen(model: Model, prompts: Path, work: Path, tokenizer: Any, affinity: bool,
                 prefill_tokens_per_s: float) -> dict[str, Any]:
    from producer.settings import ProducerSettings

    name = "on" if affinity else "off"
    fleet_spec = replace(spec(model, Fleet("equal", [1.0] * model.gpus)),
                         sim_args=["--prefill-tokens-per-s", f"{prefill_tokens_per_s:.0f}",
                                   "--max-total-tokens", str(KV_TOKENS)])
    local = LocalFleet(work / f"fg-{name}", fleet_spec)
    local.start()
    out = work / f"fg-{name}-out"
    try:
        settings = ProducerSettings(input=prompts, run=f"bench-affinity-{name}",
                                    redis_url=local.redis_url, context_length=CONTEXT,
                                    turns="all", out=out, affinity=affinity,
                                    affinity_wait_s=AFFINITY_WAIT_S)
        t0, end, summary = run_all_turns(settings, tokenizer)
        totals = sim_totals(local)
    finally:
        local.stop()
    later = [orjson.loads(raw) for raw in (out / "results.jsonl").read_bytes().splitlines()]
    later = [r for r in later if r["turn"] > 1]
    later_prompt = sum(r["prompt_tokens"] for r in later)
    return {"makespan_s": round(end - t0, 2), "done": summary["done"],
            "prompt_tokens": summary["prompt_tokens"],
            "prompt_tokens_computed": int(totals["prefill_tokens_total"]),
            "later_turns_cached_share": round(sum(r["cached_tokens"] for r in later)
                                              / max(later_prompt, 1), 3)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench affinity", description=__doc__)
    parser.add_argument("--conversations", type=int, default=160)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--words", type=int, default=400, help="words in a user turn")
    parser.add_argument("--output-tokens-mean", type=int, default=100)
    parser.add_argument("--work", type=Path, help="keep logs and outputs here")
    args = parser.parse_args(argv)
    model = Model(output_tokens_mean=args.output_tokens_mean)
    prefill = REAL_PREFILL_TOKENS_PER_S * REAL_TPOT_MS / model.tpot_ms
    from producer.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("qwen3.6")
    with tempfile.TemporaryDirectory(prefix="bench-affinity-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prompts = work / "conversations.jsonl"
        turns = write_conversations(prompts, args.conversations, args.turns, args.words)
        runs = {name: run_fleetgen(model, prompts, work, tokenizer, name == "on", prefill)
                for name in ("off", "on")}
    on, off = runs["on"], runs["off"]
    computed_ratio = on["prompt_tokens_computed"] / max(off["prompt_tokens_computed"], 1)
    makespan_ratio = on["makespan_s"] / off["makespan_s"]
    print(table("prefix affinity, --turns all",
                ["affinity", "makespan s", "prompt tokens", "computed", "later turns cached"],
                [[name, r["makespan_s"], r["prompt_tokens"], r["prompt_tokens_computed"],
                  r["later_turns_cached_share"]] for name, r in runs.items()]))
    print(f"{turns} turns on {model.gpus} GPUs, prefill {prefill:,.0f} tokens/s: prompt tokens "
          f"computed on/off {computed_ratio:.3f}, makespan on/off {makespan_ratio:.3f}")
    save("affinity", {"runs": runs, "computed_ratio": round(computed_ratio, 3),
                      "makespan_ratio": round(makespan_ratio, 3),
                      "prefill_tokens_per_s": prefill}, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
