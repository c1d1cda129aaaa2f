"""Turns bench: `--turns all` on conversations of 1-4 user turns, against a perfect dispatcher
that knows the same dependency (turn k+1 only after turn k is done).

fleetgen runs the conversations on simulated GPUs (the fleet bench's capacity model); the
perfect dispatcher replays the very answers it got (their service times, full speed) with
zero overhead: a slot that frees takes the next ready turn at once, a turn is ready the moment
the turn before it finishes. Two orders for the ready turns: next turns first (what fleetgen
does: they go to the front of the queue) and first come first served. The ratio is fleetgen's
makespan over the better of the two, in the same run; the utilization over time (running
slots / slots, from the simulators' own counts) shows whether the turn dependency idles the
fleet while other conversations still have work.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.common import save, table
from bench.fleet import CONTEXT, Fleet, Model, Poller, drain_alongside, local_fleet, sim_gpus
from fleetgen.queue.contract import KIND_RESULT
from fleetgen.queue.redisconn import connect
from fleetgen.records.outdir import OutputDir

TOPICS = ["the sea", "prime numbers", "a recipe", "Rust lifetimes", "the Roman empire",
          "jazz", "tides", "compilers", "bees", "chess openings"]


def write_conversations(path: Path, count: int, seed: int = 0) -> int:
    """`count` conversations of 1-4 user turns (uniform), the dataset's own answers between
    them; returns the number of turns."""
    rng = random.Random(seed)
    turns = 0
    with path.open("wb") as f:
        for i in range(count):
            n = rng.randint(1, 4)
            turns += n
            messages: list[dict[str, str]] = []
            for k in range(n):
                words = " ".join(rng.choice(TOPICS) for _ in range(rng.randint(3, 40)))
                messages.append({"role": "user", "content": f"Turn {k + 1}: tell me about "
                                                            f"{words}."})
                messages.append({"role": "assistant", "content": "an original answer"})
            f.write(orjson.dumps({"id": f"conv{i}", "messages": messages}) + b"\n")
    return turns


def perfect(chains: list[list[float]], slots: int, next_first: bool) -> float:
    """Makespan of a zero-overhead dispatcher over `slots` equal slots: chains[i] are the
    service times of conversation i's turns, each ready when the one before it finishes."""
    ready: deque[tuple[int, int]] = deque((i, 0) for i in range(len(chains)) if chains[i])
    running: list[tuple[float, int, int]] = []
    now, free = 0.0, slots
    while ready or running:
        while free and ready:
            conv, turn = ready.popleft()
            heapq.heappush(running, (now + chains[conv][turn], conv, turn))
            free -= 1
        now, conv, turn = heapq.heappop(running)
        free += 1
        if turn + 1 < len(chains[conv]):
            (ready.appendleft if next_first else ready.append)((conv, turn + 1))
    return now


def chains_of(model: Model, results: Path) -> list[list[float]]:
    by_conv: dict[int, dict[int, float]] = {}
    for raw in results.read_bytes().splitlines():
        r = orjson.loads(raw)
        by_conv.setdefault(r["line"], {})[r["turn"]] = model.service_s(r["completion_tokens"])
    return [[turns[k] for k in sorted(turns)] for _, turns in sorted(by_conv.items())]


def run_fleetgen(model: Model, prompts: Path, work: Path, tokenizer: Any) -> dict[str, Any]:
    from producer.settings import ProducerSettings

    fleet = Fleet("equal", [1.0] * model.gpus)
    local = local_fleet(work / "fg-turns", model, sim_gpus(model, fleet))
    local.start()
    out = work / "fg-turns-out"
    try:
        settings = ProducerSettings(input=prompts, run="bench-turns", redis_url=local.redis_url,
                                    context_length=CONTEXT, turns="all", out=out)
        poller = Poller([local.engine_url(g) for g in range(model.gpus)]).start()
        t0, end, summary = run_all_turns(settings, tokenizer)
        busy = poller.finish({})
        series = [(round(t - t0, 2), n) for t, n in poller.series if t >= t0]
    finally:
        local.stop()
    return {"makespan_s": end - t0, "busy_slot_s": busy, "series": series,
            "summary": {k: summary[k] for k in ("total", "done", "failed", "rejected",
                                                "truncated", "completion_tokens")},
            "chains": chains_of(model, OutputDir(out).file(KIND_RESULT))}


def run_all_turns(settings: Any, tokenizer: Any, watch: Callable[[Any], None] | None = None,
                  ) -> tuple[float, float, dict[str, Any]]:
    """A run to its end (`--turns all` or not), the producer beside the drainer (the job's
    path): (start, end) on perf_counter and the summary. `watch` sees the producer first."""
    from fleetgen.drainer import Drainer
    from producer.build import standalone_producer

    assert settings.out is not None
    drainer = Drainer(connect(settings.redis_url), settings.run, settings.out, block_ms=50)
    drainer.recover()
    # It waits for the run below, as `fleetgen produce`.
    producer = standalone_producer(settings, tokenizer=tokenizer, waits=True)
    if watch is not None:
        watch(producer)
    t0 = time.perf_counter()

    def produce() -> None:
        producer.send_pass()
        producer.wait_until_generated(2.0)  # it builds every next turn while it waits

    end = drain_alongside(drainer, produce, producer.wake)
    return t0, end, drainer.write_summary()


def utilization_over_time(series: list[tuple[float, int]], slots: int, makespan_s: float,
                          buckets: int = 10) -> list[float]:
    """Mean running slots / slots in each tenth of the makespan."""
    sums, counts = [0.0] * buckets, [0] * buckets
    for t, running in series:
        if 0 <= t < makespan_s:
            b = min(int(t / makespan_s * buckets), buckets - 1)
            sums[b] += running / slots
            counts[b] += 1
    return [round(s / c, 3) if c else 0.0 for s, c in zip(sums, counts, strict=True)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench turns", description=__doc__)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=Model.gpus)
    parser.add_argument("--slots", type=int, default=Model.slots)
    parser.add_argument("--tpot-ms", type=float, default=Model.tpot_ms)
    parser.add_argument("--work", type=Path, help="keep logs and outputs here")
    args = parser.parse_args(argv)
    model = Model(gpus=args.gpus, slots=args.slots, tpot_ms=args.tpot_ms)
    from producer.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("qwen3.6")
    with tempfile.TemporaryDirectory(prefix="bench-turns-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prompts = work / "conversations.jsonl"
        turns = write_conversations(prompts, args.conversations)
        r = run_fleetgen(model, prompts, work, tokenizer)
    slots = model.gpus * model.slots
    chains = r.pop("chains")
    service = sum(map(sum, chains))
    ideal = {"next_turns_first_s": perfect(chains, slots, True),
             "first_come_first_served_s": perfect(chains, slots, False),
             "lower_bound_s": max(service / slots, max(map(sum, chains)))}
    best = min(ideal["next_turns_first_s"], ideal["first_come_first_served_s"])
    utilization = sum(r["busy_slot_s"]) / (slots * r["makespan_s"])
    over_time = utilization_over_time(r["series"], slots, r["makespan_s"])
    figures = {"model": model.__dict__, "context_length": CONTEXT,
               "conversations": args.conversations, "turns": turns,
               "makespan_s": r["makespan_s"], "perfect": ideal, "ratio_to_perfect":
               r["makespan_s"] / best, "utilization": utilization,
               "utilization_by_tenth": over_time, "service_s": service, **r["summary"],
               "running_series": r["series"]}
    print(table(f"turns: {args.conversations} conversations ({turns} turns, 1-4 user turns "
                f"each), --turns all, {model.gpus} simulated GPUs x {model.slots} slots, "
                f"tpot {model.tpot_ms:g} ms, answers lognormal mean {model.output_tokens_mean}",
                ["system", "makespan s", "x perfect", "utilization"],
                [["fleetgen --turns all", r["makespan_s"], r["makespan_s"] / best,
                  f"{100 * utilization:.1f} %"],
                 ["perfect, next turns first", ideal["next_turns_first_s"],
                  ideal["next_turns_first_s"] / best, ""],
                 ["perfect, first come first served", ideal["first_come_first_served_s"],
                  ideal["first_come_first_served_s"] / best, ""],
                 ["lower bound max(work/slots, longest chain)", ideal["lower_bound_s"],
                  ideal["lower_bound_s"] / best, ""]]))
    print("utilization by tenth of the run:", " ".join(f"{100 * u:.0f}%" for u in over_time))
    save("turns", figures, vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
