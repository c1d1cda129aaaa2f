"""Affinity bench: prompts that share prefixes, on 8 simulated GPUs whose prefill costs what it
costs (fleetgen/simulator: uncached prompt tokens at a prefill rate, in chunks, holding up the
running batch), with prefix affinity on against off, in the same run. Three sets:

- `turns`: `--turns all` on conversations with long histories (each next turn's prompt is the
  whole conversation so far);
- `samples`: long prompts, `--n 4` samples each (every sample its own request);
- `system`: prompts opening with one of a few long system prompts, each shared by some rows.

Figures: prompt tokens computed (the simulators' own count of uncached prompt tokens) and the
makespan, on against off; for `turns`, the share of the history served from cache. A later
turn's history is what its server could hold of it: the longest common prefix of its prompt's
token ids with the turn before's prompt and output ids (Qwen3.6's template drops the answer's
reasoning from the history, so the history re-renders apart from the generated sequence at the
answer's first token: no server can hold more). The prefill rate is a real GPU's (8,000
tokens/s for a 27B model on one H100, docs/simulator.md) scaled by the GPU's decoding
throughput (a real one decodes REAL_RUNNING requests at ~20 ms a token; the bench's, its slots
at Model.tpot_ms), so a prompt token costs what it costs on the real GPU in output tokens;
the KV pool, what the prefix cache holds, a real GPU's (KV_TOKENS).
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
from bench.fleet import CONTEXT, Fleet, Model, local_fleet, sim_gpus
from bench.turns import run_all_turns
from fleetgen.local.fleet import LocalFleet
from fleetgen.queue.contract import slot_of

REAL_PREFILL_TOKENS_PER_S = 8000.0
REAL_TPOT_MS = 20.0
# Requests a real 27B server decodes at once (docs/simulator.md): with REAL_TPOT_MS a token
# each, 3,200 output tokens a second; a prompt token costs 8,000 / 3,200 of an output token.
REAL_RUNNING = 64
# A GPU's KV pool, what its prefix cache can hold: a 27B model on an 80 GB GPU keeps some
# 250,000 tokens of KV (the simulator's own default, slots x context, is 16,384 at the bench's
# 2 slots: a cache no real server is that small).
KV_TOKENS = 262_144
# The product's 2 s wait in a worker's queue, on the bench's time scale (its GPUs decode
# REAL_TPOT_MS / Model.tpot_ms = 40 x faster than a real one).
AFFINITY_WAIT_S = 0.05
WORDS = ["tide", "prime", "recipe", "lifetime", "empire", "jazz", "compiler", "bee", "chess",
         "river", "proof", "kernel", "harbour", "violin", "glacier", "lattice"]
SETS = ("turns", "samples", "system")
# The producer keeps twice the fleet's concurrency queued (producer/enqueue.py), with a floor of
# MIN_HIGH_WATER = 512 for large fleets: at the bench's 24 slots the floor would queue the whole
# set before the first answer, which no real run of 654,676 prompts sees. The bench queues what
# the rule says for its fleet, in batches small beside it, as 512 is beside a real fleet's.
BATCH = 16


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def write_conversations(path: Path, count: int, turns: int, words: int, seed: int = 0) -> int:
    """`count` conversations of `turns` long user turns each; returns the number of turns."""
    rng = random.Random(seed)
    with path.open("wb") as f:
        for i in range(count):
            messages: list[dict[str, str]] = []
            for k in range(turns):
                messages += [{"role": "user", "content": f"Turn {k + 1} of {i}: "
                              f"{_text(rng, words)}"},
                             {"role": "assistant", "content": "an original answer"}]
            f.write(orjson.dumps({"id": f"conv{i}", "messages": messages}) + b"\n")
    return count * turns


def write_prompts(path: Path, count: int, words: int, systems: int = 0,
                  seed: int = 0) -> int:
    """`count` prompts of `words` words; with `systems`, each opens with one of that many long
    system prompts (of `words` words too), row i with system prompt i % systems, so the rows
    sharing one are spread over the input as a data set's are. Returns the rows."""
    rng = random.Random(seed)
    prompts = [f"You are assistant {k}. {_text(rng, words)}" for k in range(systems)]
    with path.open("wb") as f:
        for i in range(count):
            messages = [{"role": "system", "content": prompts[i % systems]}] if systems else []
            messages.append({"role": "user", "content": f"Question {i}: {_text(rng, words)}"})
            f.write(orjson.dumps({"id": f"row{i}", "messages": messages}) + b"\n")
    return count


def sim_totals(local: LocalFleet) -> dict[str, float]:
    keys = ("prefill_tokens_total", "cached_tokens_total")
    totals = dict.fromkeys(keys, 0.0)
    for gpu in range(local.spec.gpus):
        stats = httpx.get(local.engine_url(gpu) + "/_sim/stats", timeout=10).json()
        for key in keys:
            totals[key] += float(stats.get(key, 0))
    return totals


def record_prompts(sent: dict[int, list[int]]) -> Any:
    """A producer watch that keeps every request's prompt ids by slot, as the producer sends
    them (first turns and next turns)."""
    def watch(producer: Any) -> None:
        enqueuer = producer.enqueuer
        for name in ("send", "send_next"):
            original = getattr(enqueuer, name)

            def recording(payloads: list[Any], *args: Any, _send: Any = original,
                          **kwargs: Any) -> Any:
                sent.update((slot_of(p), list(p["input_ids"])) for p in payloads)
                return _send(payloads, *args, **kwargs)

            setattr(enqueuer, name, recording)
    return watch


def history_cached(results: list[dict[str, Any]], sent: dict[int, list[int]]
                   ) -> tuple[float, float]:
    """(the share of later turns' history served from cache, the share of later turns sent to
    the worker that answered the turn before). History: the longest common prefix of the
    turn's prompt ids with the turn before's prompt and output ids."""
    by_slot = {slot_of(r): r for r in results}
    history = cached = same = later = 0
    for slot, record in by_slot.items():
        before = by_slot.get(slot - 1)
        if record.get("turn", 1) == 1 or before is None:
            continue
        held = sent[slot - 1] + list(before.get("output_ids") or [])
        prompt = sent[slot]
        common = next((k for k, (a, b) in enumerate(zip(prompt, held, strict=False)) if a != b),
                      min(len(prompt), len(held)))
        history += common
        cached += min(int(record["cached_tokens"]), common)
        same += record["worker"] == before["worker"]
        later += 1
    return cached / max(history, 1), same / max(later, 1)


def run_fleetgen(model: Model, name: str, prompts: Path, work: Path, tokenizer: Any,
                 affinity: bool, prefill_tokens_per_s: float, **settings: Any
                 ) -> dict[str, Any]:
    from producer.settings import ProducerSettings

    tag = f"{name}-{'on' if affinity else 'off'}"
    sims = replace(sim_gpus(model, Fleet("equal", [1.0] * model.gpus)),
                   sim_args=["--prefill-tokens-per-s", f"{prefill_tokens_per_s:.0f}",
                             "--max-total-tokens", str(KV_TOKENS)])
    local = local_fleet(work / f"fg-{tag}", model, sims)
    local.start()
    out = work / f"fg-{tag}-out"
    sent: dict[int, list[int]] = {}
    try:
        run_settings = ProducerSettings(input=prompts, run=f"bench-affinity-{tag}",
                                        redis_url=local.redis_url, context_length=CONTEXT,
                                        out=out, affinity=affinity,
                                        affinity_wait_s=AFFINITY_WAIT_S,
                                        high_water=2 * model.gpus * (model.slots
                                                                     + model.extra_concurrency),
                                        batch_size=BATCH, **settings)
        t0, end, summary = run_all_turns(run_settings, tokenizer, record_prompts(sent))
        totals = sim_totals(local)
    finally:
        local.stop()
    figures = {"makespan_s": round(end - t0, 2), "done": summary["done"],
               "prompt_tokens": summary["prompt_tokens"],
               "prompt_tokens_computed": int(totals["prefill_tokens_total"])}
    if settings.get("turns") == "all":
        results = [orjson.loads(raw) for raw in (out / "results.jsonl").read_bytes().splitlines()]
        share, same = history_cached(results, sent)
        figures.update(history_cached_share=round(share, 3), same_worker_share=round(same, 3))
    return figures


def prefill_rate(model: Model) -> float:
    """The bench GPU's prefill rate: a real GPU's, times the bench GPU's decoding throughput
    over the real one's (output tokens a second, all running requests together)."""
    real = REAL_RUNNING * 1000 / REAL_TPOT_MS
    bench = model.slots * 1000 / model.tpot_ms
    return REAL_PREFILL_TOKENS_PER_S * bench / real


def write_set(name: str, path: Path, args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """The set's input file: (its requests, the settings it runs with)."""
    if name == "turns":
        count = write_conversations(path, args.conversations, args.turns, args.words)
        return count, {"turns": "all", "token_ids": True}
    if name == "samples":
        rows = write_prompts(path, args.prompts, args.words * 2)
        return rows * 4, {"n": 4, "sampling": {"temperature": 0.8}}
    return write_prompts(path, args.prompts * 2, args.words, systems=args.prompts // 8), {}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench affinity", description=__doc__)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--conversations", type=int, default=80)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--words", type=int, default=400, help="words in a user turn")
    parser.add_argument("--prompts", type=int, default=160,
                        help="prompts of the samples set (twice as many in the system set)")
    parser.add_argument("--output-tokens-mean", type=int, default=100)
    parser.add_argument("--work", type=Path, help="keep logs and outputs here")
    args = parser.parse_args(argv)
    model = Model(output_tokens_mean=args.output_tokens_mean)
    prefill = prefill_rate(model)
    from producer.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("qwen3.6")
    figures: dict[str, Any] = {"prefill_tokens_per_s": prefill}
    with tempfile.TemporaryDirectory(prefix="bench-affinity-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.sets.split(","):
            prompts = work / f"{name}.jsonl"
            requests, settings = write_set(name, prompts, args)
            runs = {side: run_fleetgen(model, name, prompts, work, tokenizer, side == "on",
                                       prefill, **settings) for side in ("off", "on")}
            figures[name] = summarize(name, requests, runs, model, prefill)
    save("affinity", figures, vars(args))
    return 0


def summarize(name: str, requests: int, runs: dict[str, dict[str, Any]], model: Model,
              prefill: float) -> dict[str, Any]:
    on, off = runs["on"], runs["off"]
    computed_ratio = on["prompt_tokens_computed"] / max(off["prompt_tokens_computed"], 1)
    makespan_ratio = on["makespan_s"] / off["makespan_s"]
    header = ["affinity", "makespan s", "prompt tokens", "computed"]
    extra = ["history cached", "same worker"] if "history_cached_share" in on else []
    print(table(f"prefix affinity, {name} set", header + extra,
                [[side, r["makespan_s"], r["prompt_tokens"], r["prompt_tokens_computed"],
                  *[r[k] for k in ("history_cached_share", "same_worker_share") if k in r]]
                 for side, r in runs.items()]))
    print(f"{name}: {requests} requests on {model.gpus} GPUs, prefill {prefill:,.0f} tokens/s: "
          f"prompt tokens computed on/off {computed_ratio:.3f}, makespan on/off "
          f"{makespan_ratio:.3f}\n")
    return {"requests": requests, "runs": runs, "computed_ratio": round(computed_ratio, 3),
            "makespan_ratio": round(makespan_ratio, 3)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
