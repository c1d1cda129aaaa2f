"""Fleet bench: fleetgen against the seed's way on 8 simulated GPUs, three fleets, same prompts.

Fleets: all equal; gpu7 at half speed; gpu7's server SIGKILLed half-way through the run.
Each system gets freshly started simulators with the same capacity model; busy
slot-seconds come from each simulator's own stats. Utilization and the ideal makespan
count the capacity actually present: a half-speed server is half a server, a dead one
stops counting when it dies.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.baseline import FIXED_MAX_NEW_TOKENS, BaselineResult, run_baseline
from bench.common import RUN_ENV, save, table, write_varied_prompts
from bench.gap import answers_of, decompose
from bench.gap import report as gap_report
from fleetgen.engine.health import probe_url
from fleetgen.local.fleet import FleetSpec, LocalFleet
from fleetgen.local.procs import ProcessGroup
from fleetgen.local.simgpus import SimGpus
from fleetgen.queue.contract import KIND_FAILURE, KIND_RESULT
from fleetgen.queue.redisconn import connect
from fleetgen.records.outdir import OutputDir

BATCH = 512  # the producer's batch: the window it could reorder without holding rows back
CONTEXT = 8192


@dataclass(frozen=True)
class Model:
    """The fixed capacity model every simulated GPU runs (at its own speed)."""

    gpus: int = 8
    slots: int = 2
    ttft_ms: float = 50.0
    tpot_ms: float = 0.5
    output_tokens_mean: int = 300  # lognormal, sigma 1: a few answers 20x the mean
    seed: int = 0
    # Worker concurrency above the engine's slots: that many requests wait in the engine's
    # own queue, so a freed slot starts the next request at once instead of after a round
    # trip through Redis and the worker.
    extra_concurrency: int = 1

    def service_s(self, completion_tokens: int) -> float:
        """Time one request holds a slot on a full-speed GPU."""
        return (self.ttft_ms + self.tpot_ms * completion_tokens) / 1000


@dataclass
class Fleet:
    name: str
    speeds: list[float]
    die_gpu: int | None = None
    die_at_s: float | None = None  # after the run starts

    def sim_args(self) -> dict[int, list[str]]:
        args = {g: ["--speed", str(s)] for g, s in enumerate(self.speeds) if s != 1.0}
        if self.die_gpu is not None:
            args.setdefault(self.die_gpu, [])  # its own process, so it can be killed alone
        return args


@dataclass
class Poller:
    """Polls every server's /_sim/stats; a killed server keeps its last reading."""

    urls: list[str]
    last: list[tuple[float, float, int]] = field(default_factory=list)  # (t, busy, running)
    series: list[tuple[float, int]] = field(default_factory=list)  # (t, running on all)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.last = [(time.perf_counter(), 0.0, 0) for _ in self.urls]
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def poll(self, client: httpx.Client) -> None:
        for i, url in enumerate(self.urls):
            try:
                stats = client.get(url + "/_sim/stats", timeout=1.0).json()
            except httpx.HTTPError:
                continue
            self.last[i] = (time.perf_counter(), float(stats["busy_slot_seconds_total"]),
                            int(stats["num_running_reqs"]))
        self.series.append((time.perf_counter(), sum(running for _, _, running in self.last)))

    def _loop(self) -> None:
        with httpx.Client() as client:
            while not self.stop.wait(0.25):
                self.poll(client)

    def start(self) -> Poller:
        with httpx.Client() as client:
            self.poll(client)
        self.start_busy = [busy for _, busy, _ in self.last]
        self._thread.start()
        return self

    def busy(self, died_at: dict[int, float]) -> list[float]:
        """Busy slot-seconds of each server so far (a dead one up to its death)."""
        with httpx.Client() as client:
            self.poll(client)
        busy = []
        for i, (t, value, running) in enumerate(self.last):
            if i in died_at:  # the slots it held were busy until the moment it died
                value += running * max(0.0, died_at[i] - t)
            busy.append(value - self.start_busy[i])
        return busy

    def finish(self, died_at: dict[int, float]) -> list[float]:
        self.stop.set()
        self._thread.join()
        return self.busy(died_at)


def sim_gpus(model: Model, fleet: Fleet) -> SimGpus:
    return SimGpus(gpus=model.gpus, context_length=CONTEXT, max_running_requests=model.slots,
                   ttft_ms=model.ttft_ms, tpot_ms=model.tpot_ms,
                   output_tokens_mean=model.output_tokens_mean, seed=model.seed,
                   gpu_sim_args=fleet.sim_args())


def local_fleet(work_dir: Path, model: Model, sims: SimGpus) -> LocalFleet:
    """fleetgen's fleet on these simulated GPUs, its workers at the model's concurrency."""
    spec = FleetSpec(concurrency=model.slots + model.extra_concurrency)
    return LocalFleet(work_dir, spec, servers=sims)


def kill_later(fleet: Fleet, sims: SimGpus, t0: float, died: dict[int, float]) -> None:
    """SIGKILL the dying GPU's simulator at its time: its port closes, connections drop."""
    if fleet.die_gpu is None or fleet.die_at_s is None:
        return
    gpu, at = fleet.die_gpu, fleet.die_at_s

    def kill() -> None:
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        sims.children[gpu].signal(signal.SIGKILL)
        died[gpu] = time.perf_counter()

    threading.Thread(target=kill, daemon=True).start()


def run_fleetgen(model: Model, fleet: Fleet, prompts: Path, work: Path,
                 tokenizer: Any, affinity: bool = True) -> dict[str, Any]:
    from fleetgen.drainer import Drainer
    from producer.build import standalone_producer
    from producer.settings import ProducerSettings

    tag = fleet.name if affinity else f"{fleet.name}-no-affinity"
    sims = sim_gpus(model, fleet)
    local = local_fleet(work / f"fg-{tag}", model, sims)
    local.start()
    try:
        run = f"bench-{tag}"
        settings = ProducerSettings(input=prompts, run=run, redis_url=local.redis_url,
                                    context_length=CONTEXT, affinity=affinity)
        # It waits for the run, as `fleetgen run` does.
        producer = standalone_producer(settings, tokenizer=tokenizer, waits=True)
        poller = Poller([local.engine_url(g) for g in range(model.gpus)]).start()
        drainer = Drainer(connect(local.redis_url), run, work / f"fg-{tag}-out",
                          block_ms=50)
        drainer.recover()
        died: dict[int, float] = {}
        t0, t0_unix = time.perf_counter(), time.time()
        kill_later(fleet, sims, t0, died)

        def produce() -> None:
            producer.send_pass()
            producer.wait_until_generated(2.0)

        end = drain_alongside(drainer, produce, producer.wake)
        summary = drainer.write_summary()
        busy = poller.finish({g: t - t0 for g, t in died.items()} if died else {})
        written = OutputDir(work / f"fg-{tag}-out")
        service = _service_s(model, written.file(KIND_RESULT))
        replay = replays(model, fleet, _jobs(model, written.file(KIND_RESULT)),
                         _rel_int(died, t0))
        failures = _lines(written.file(KIND_FAILURE))
        answers = answers_of(_lines(written.file(KIND_RESULT)), t0_unix, fleet.speeds,
                             model.service_s)
    finally:
        local.stop()
    died_rel = _rel(died, t0)
    gap = decompose(answers, fleet.speeds, model.slots,
                    (end - t0, ideal_s(model, fleet, service, died_rel), replay["fifo_s"]),
                    busy)
    return {"system": "fleetgen" if affinity else "fleetgen --no-affinity",
            "fleet": fleet.name, "makespan_s": end - t0, "t0_unix": t0_unix,
            "in_flight_per_server": model.slots + model.extra_concurrency,
            "busy_slot_s": busy, "service_s": service, "died_at_s": died_rel,
            "running_series": _series(poller, t0), "replay": replay, "gap": gap,
            "rows": summary["total"], "completed": summary["done"],
            "failed": summary["failed"], "rejected": summary["rejected"],
            "truncated": summary["truncated"],
            "context_length_failures": sum(f["error"].get("status") == 400 for f in failures),
            "completion_tokens": summary["completion_tokens"]}


def drain_alongside(drainer: Any, produce: Callable[[], object],
                    wake: Callable[[], None] = lambda: None) -> float:
    """The job's own producer-beside-drainer (fleetgen/cli/steps.py); returns when the run was
    complete (perf_counter), before the drainer is closed."""
    from fleetgen.cli.beside import Beside, drain_beside

    producer = Beside(produce, wake)
    drain_beside(drainer, producer)
    end = time.perf_counter()
    drainer.close()
    return end


def run_seed(model: Model, fleet: Fleet, rows: list[tuple[str, list[int]]], work: Path,
             in_flight: int) -> list[dict[str, Any]]:
    """The seed's run with `in_flight` requests per server; where a server died, also the
    seed's remedy: a second pass over the rows that failed to connect, sharded over the
    servers still up."""
    tag = f"bl{in_flight}-{fleet.name}"
    sims = sim_gpus(model, fleet)
    procs = ProcessGroup(work / tag / "logs")
    out = work / f"{tag}.jsonl"
    name = seed_name(model, in_flight)
    try:
        urls = sims.start(procs, 60.0)
        poller = Poller(urls).start()
        died: dict[int, float] = {}
        t0 = time.perf_counter()
        kill_later(fleet, sims, t0, died)
        first = asyncio.run(run_baseline(urls, rows, in_flight, out))
        results = [_seed_result(model, fleet, name, first, [out], rows,
                                poller.busy(_rel_int(died, t0)), _rel(died, t0))]
        lost = {r["id"] for r in _lines(out) if "error" in r and r["status"] is None}
        if lost:
            # /ready: SGLang's /health is a generation probe (>= 1 s), not a liveness check.
            alive = [url for url in urls if probe_url(url).ready]
            again = work / f"{tag}-rerun.jsonl"
            second = asyncio.run(run_baseline(alive, [r for r in rows if r[0] in lost],
                                              in_flight, again))
            both = _merge(first, second, len(lost))
            results.append(_seed_result(model, fleet, name + " + rerun of lost rows", both,
                                        [out, again], rows, poller.busy(_rel_int(died, t0)),
                                        _rel(died, t0)))
        poller.finish({})
        for r in results:
            r["running_series"] = _series(poller, t0)
            r["in_flight_per_server"] = in_flight
    finally:
        procs.stop_all()
    return results


def seed_name(model: Model, in_flight: int) -> str:
    """"seed, K" or "seed, K+1": the in-flight count against the engine's K slots."""
    extra = in_flight - model.slots
    return "seed, K" + (f"{extra:+d}" if extra else "")


def _merge(first: BaselineResult, second: BaselineResult, rerun: int) -> BaselineResult:
    """Both passes as one run: times add up, the rerun rows count once."""
    statuses = dict(first.failures_by_status)
    statuses["None"] = statuses.get("None", 0) - rerun
    for status, n in second.failures_by_status.items():
        statuses[status] = statuses.get(status, 0) + n
    return BaselineResult(
        makespan_s=first.makespan_s + second.makespan_s,
        completed=first.completed + second.completed,
        failed=first.failed - rerun + second.failed,
        truncated=first.truncated + second.truncated,
        context_length_failures=first.context_length_failures + second.context_length_failures,
        completion_tokens=first.completion_tokens + second.completion_tokens,
        failures_by_status={k: v for k, v in statuses.items() if v})


def _seed_result(model: Model, fleet: Fleet, system: str, result: BaselineResult,
                 outputs: list[Path], rows: list[tuple[str, list[int]]], busy: list[float],
                 died: dict[str, float]) -> dict[str, Any]:
    records = [r for path in outputs for r in _lines(path)]
    service = sum(model.service_s(r["completion_tokens"]) for r in records if "error" not in r)
    return {"system": system, "fleet": fleet.name, "makespan_s": result.makespan_s,
            "busy_slot_s": busy, "service_s": service, "died_at_s": died,
            "rows": len(rows), "completed": result.completed, "failed": result.failed,
            "rejected": 0, "truncated": result.truncated,
            "context_length_failures": result.context_length_failures,
            "failures_by_status": result.failures_by_status,
            "completion_tokens": result.completion_tokens}


def _series(poller: Poller, t0: float) -> list[tuple[float, int]]:
    """Slots running on the whole fleet over the run, for finding where idle time is."""
    return [(round(t - t0, 2), n) for t, n in poller.series if t >= t0]


def _rel_int(died: dict[int, float], t0: float) -> dict[int, float]:
    return {g: t - t0 for g, t in died.items()}


def _rel(died: dict[int, float], t0: float) -> dict[str, float]:
    return {str(g): t - t0 for g, t in died.items()}


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _service_s(model: Model, results: Path) -> float:
    return sum(model.service_s(r["completion_tokens"]) for r in _lines(results))


def _jobs(model: Model, results: Path) -> list[tuple[int, float, int]]:
    """(input line, full-speed service s, max_tokens) of every completed row."""
    return sorted((r["line"], model.service_s(r["completion_tokens"]), r["max_tokens"])
                  for r in _lines(results))


def list_schedule(services: list[float], slot_speeds: list[float],
                  slot_end: list[float]) -> float:
    """Makespan of greedy list scheduling with zero overhead: each job, in the order given,
    starts on the slot that frees first (a slot past its end, a dead server's, is skipped)."""
    import heapq

    free = [(0.0, i) for i in range(len(slot_speeds))]
    heapq.heapify(free)
    finish = 0.0
    for service in services:
        while True:
            at, i = heapq.heappop(free)
            done = at + service / slot_speeds[i]
            if done <= slot_end[i]:
                break
        heapq.heappush(free, (done, i))
        finish = max(finish, done)
    return finish


def replays(model: Model, fleet: Fleet, jobs: list[tuple[int, float, int]],
            died_at: dict[int, float]) -> dict[str, float]:
    """The same service times under three orders, with a perfect zero-overhead dispatcher:
    input order (what fleetgen does), largest max_tokens first (knowable before the run),
    and longest service first (needs an oracle: output lengths are not known in advance)."""
    speeds = [s for s in fleet.speeds for _ in range(model.slots)]
    ends = [died_at.get(g, float("inf")) for g in range(model.gpus) for _ in range(model.slots)]
    fifo = [service for _, service, _ in jobs]
    by_budget = [service for _, service, _ in sorted(jobs, key=lambda j: -j[2])]
    windowed = [service for start in range(0, len(jobs), BATCH)
                for _, service, _ in sorted(jobs[start:start + BATCH], key=lambda j: -j[2])]
    return {"fifo_s": list_schedule(fifo, speeds, ends),
            "max_tokens_first_s": list_schedule(by_budget, speeds, ends),
            "max_tokens_first_per_batch_s": list_schedule(windowed, speeds, ends),
            "oracle_longest_first_s": list_schedule(sorted(fifo, reverse=True), speeds, ends)}


def capacity(model: Model, fleet: Fleet, died_at_s: dict[str, float], t: float) -> float:
    """Full-speed slot-seconds the servers present offer in [0, t]."""
    died = {int(g): at for g, at in died_at_s.items()}
    present = [died.get(g, float("inf")) for g in range(model.gpus)]
    return model.slots * sum(s * min(t, p) for s, p in zip(fleet.speeds, present, strict=True))


def ideal_s(model: Model, fleet: Fleet, service_s: float, died_at_s: dict[str, float]
            ) -> float:
    """When the capacity present has delivered the run's service time."""
    lo, hi = 0.0, 10 * service_s / model.slots + 1000
    for _ in range(100):  # capacity() is increasing: bisect for capacity(t) == service
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capacity(model, fleet, died_at_s, mid) < service_s else (lo, mid)
    return hi


def score(model: Model, fleet: Fleet, r: dict[str, Any]) -> dict[str, Any]:
    """Ideal makespan and utilization over the capacity actually present."""
    ideal = ideal_s(model, fleet, r["service_s"], r["died_at_s"])
    busy_full_speed = sum(b * s for b, s in zip(r["busy_slot_s"], fleet.speeds, strict=True))
    longest = model.service_s(CONTEXT)  # no request can hold a slot longer than this
    return {**r, "ideal_s": ideal, "ratio_to_ideal": r["makespan_s"] / ideal,
            "utilization": busy_full_speed / capacity(model, fleet, r["died_at_s"],
                                                      r["makespan_s"]),
            "longest_possible_request_s": longest}


def prepare_rows(prompts: Path, tokenizer: Any) -> list[tuple[str, list[int]]]:
    """The baseline's input: every row rendered and tokenized once, before its clock starts
    (it gets the same ids fleetgen sends, so the simulators do the same work for both)."""
    from producer.rows import Row, read_rows

    rows = [r for r in read_rows(prompts) if isinstance(r, Row) and r.messages]
    ids = tokenizer.encode_batch([tokenizer.render(r.messages) for r in rows])
    return [(r.id, i) for r, i in zip(rows, ids, strict=True)]


def seed_in_flight(model: Model, system: str) -> int:
    """"seed" -> K in flight per server, "seed+N" -> K + N."""
    if system == "seed":
        return model.slots
    if system.startswith("seed+") and system[5:].isdigit():
        return model.slots + int(system[5:])
    raise ValueError(f"unknown system {system!r}: fleetgen, seed or seed+N")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fleet", description=__doc__)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--fleets", default="equal,half-speed,dies")
    parser.add_argument("--tpot-ms", type=float, default=Model.tpot_ms)
    parser.add_argument("--slots", type=int, default=Model.slots)
    parser.add_argument("--gpus", type=int, default=Model.gpus)
    # seed: K requests in flight per server, as the seed script sends; seed+1: K + 1, what
    # fleetgen's workers hold (-c = K + extra), so the comparison is like for like.
    # fleetgen-off: fleetgen with --no-affinity (first turns that share a prefix all to the
    # shared queue), to weigh prefix affinity on the same fleet in the same run.
    parser.add_argument("--systems", default="fleetgen,seed,seed+1")
    parser.add_argument("--extra-concurrency", type=int, default=Model.extra_concurrency)
    parser.add_argument("--figure", default="fleet",
                        help="the figures file: bench/figures/NAME.json (fleet-equal for a run "
                        "of the equal fleet alone, so fleet.json keeps all three)")
    parser.add_argument("--work", type=Path, help="keep logs and outputs here (default: a "
                        "temporary directory, removed)")
    args = parser.parse_args(argv)
    model = Model(gpus=args.gpus, slots=args.slots, tpot_ms=args.tpot_ms,
                  extra_concurrency=args.extra_concurrency)
    from producer.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("qwen3.6")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prompts = write_varied_prompts(work / "prompts.jsonl", args.rows)
        rows = prepare_rows(prompts, tokenizer)
        # Half-way through a run: the equal fleet's expected makespan (service time of the
        # mean answer), halved.
        slots = model.gpus * model.slots
        expected = args.rows * model.service_s(model.output_tokens_mean) / slots
        fleets = {"equal": Fleet("equal", [1.0] * model.gpus),
                  "half-speed": Fleet("half-speed", [1.0] * (model.gpus - 1) + [0.5]),
                  "dies": Fleet("dies", [1.0] * model.gpus, die_gpu=model.gpus - 1,
                                die_at_s=expected / 2)}
        for name in args.fleets.split(","):
            fleet = fleets[name]
            for system in args.systems.split(","):
                runs = ([run_fleetgen(model, fleet, prompts, work, tokenizer,
                                      affinity=system == "fleetgen")]
                        if system.startswith("fleetgen") else
                        run_seed(model, fleet, rows, work, seed_in_flight(model, system)))
                for r in runs:
                    results.append(score(model, fleet, r))
                    print(f"  {name:<10} {r['system']:<26} makespan {r['makespan_s']:.1f} s",
                          flush=True)
                    if "gap" in r:
                        print(gap_report(r["gap"]), flush=True)
    print(report(model, args.rows, results))
    if args.figure != "fleet":  # the provenance names the command that wrote the file
        os.environ.setdefault(RUN_ENV, f"python -m bench fleet --fleets {args.fleets} "
                                       f"--figure {args.figure} (alone)")
    save(args.figure, {"model": model.__dict__, "context_length": CONTEXT,
                   "rows": args.rows, "baseline_max_new_tokens": FIXED_MAX_NEW_TOKENS,
                   "results": results}, vars(args))
    return 0


def report(model: Model, rows: int, results: list[dict[str, Any]]) -> str:
    header = ["fleet", "system", "makespan s", "ideal s", "x ideal", "utilization",
              "completed", "failed", "ctx-len 400s", "truncated", "rejected"]
    body = [[r["fleet"], r["system"], r["makespan_s"], r["ideal_s"], r["ratio_to_ideal"],
             f"{100 * r['utilization']:.1f} %", r["completed"], r["failed"],
             r["context_length_failures"], r["truncated"], r["rejected"]] for r in results]
    title = (f"fleet: {model.gpus} simulated GPUs x {model.slots} slots, "
             f"ttft {model.ttft_ms:g} ms, "
             f"tpot {model.tpot_ms:g} ms, answers lognormal mean {model.output_tokens_mean}, "
             f"{rows:,} prompts, context {CONTEXT}")
    return table(title, header, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
