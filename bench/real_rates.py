"""`python -m bench real_rates`: the real server's tokens a second at each fixed number of
requests in flight, as the server counts them (vLLM's `vllm:generation_tokens_total`).

What the pacer (workers/pacing.py) has to find, measured directly: bench real's server (vLLM
0.32 on CPU, core 0) and rows, each count kept in flight by a plain asyncio client on core 1
(a finished request is replaced at once; the first `count` starts spread over a few seconds, so
that answers of one length do not end together), the counter read once `--warm-s` has passed
and again `--window-s` later. Requests cut at the window's end are aborted by the server
when their connection closes; the next count starts once it runs nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from bench.common import save, table
from bench.real import CLIENT_CORE, ROOT, PinnedServer, pinned, write_rows
from fleetgen.engine.builtin import VLLM_GAUGES
from fleetgen.engine.load import METRICS_PATH, parse_load


def arguments(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench real_rates", description=__doc__)
    p.add_argument("--counts", default="4,8,16,24,32,48,64,96,128",
                   help="the numbers in flight, comma-separated")
    p.add_argument("--max-tokens", type=int, default=96, help="every answer's cap")
    p.add_argument("--warm-s", type=float, default=25.0)
    p.add_argument("--window-s", type=float, default=45.0)
    p.add_argument("--engine-url", help="a vLLM server already up (not pinned by the bench)")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)  # the pinned half
    p.add_argument("--ids", help=argparse.SUPPRESS)
    return p.parse_args(argv)


async def _load(client: httpx.AsyncClient) -> tuple[int, float]:
    load = parse_load((await client.get(METRICS_PATH)).text, VLLM_GAUGES)
    if load is None or load.generated is None:
        raise SystemExit("the server's /metrics has no vllm:generation_tokens_total")
    return load.running, load.generated


async def rate_at(client: httpx.AsyncClient, prompts: list[list[int]], count: int,
                  args: argparse.Namespace) -> float:
    """Tokens a second with `count` requests kept in flight, over the window."""
    stop = asyncio.Event()

    async def keep_one(k: int) -> None:
        await asyncio.sleep(k * 4.0 / count)  # spread the first answers' ends
        i = k
        while not stop.is_set():
            body = {"model": "tiny", "prompt": prompts[i % len(prompts)],
                    "max_tokens": args.max_tokens}
            (await client.post("/v1/completions", json=body)).raise_for_status()
            i += count

    tasks = [asyncio.create_task(keep_one(k)) for k in range(count)]
    await asyncio.sleep(args.warm_s)
    _, first = await _load(client)
    started = time.monotonic()
    await asyncio.sleep(args.window_s)
    _, last = await _load(client)
    rate = (last - first) / (time.monotonic() - started)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    while (await _load(client))[0]:  # the aborted requests leave the server
        await asyncio.sleep(0.5)
    return rate


async def measure(url: str, prompts: list[list[int]], args: argparse.Namespace) -> list[float]:
    counts = [int(c) for c in args.counts.split(",")]
    limits = httpx.Limits(max_connections=max(counts) + 4)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=900) as client:
        return [await rate_at(client, prompts, c, args) for c in counts]


def client_main(args: argparse.Namespace) -> int:
    """The half that runs on the client's core: prints one rate per count."""
    prompts = orjson.loads(Path(args.ids).read_bytes())
    rates = asyncio.run(measure(args.engine_url, prompts, args))
    print(" ".join(f"{r:.3f}" for r in rates))
    return 0


def main(argv: list[str]) -> int:
    args = arguments(argv)
    if args.client:
        return client_main(args)
    counts = [int(c) for c in args.counts.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-real-rates-") as tmp:
        work = Path(tmp)
        ids = work / "ids.json"
        ids.write_bytes(orjson.dumps(write_rows(work / "rows.jsonl", 270)))
        with PinnedServer(work, args.engine_url) as url:
            argv_client = [sys.executable, "-m", "bench.real_rates", "--client", "--ids",
                           str(ids), "--engine-url", url, "--counts", args.counts,
                           "--max-tokens", str(args.max_tokens), "--warm-s", str(args.warm_s),
                           "--window-s", str(args.window_s)]
            out = subprocess.run(pinned(CLIENT_CORE, argv_client), capture_output=True,
                                 text=True, check=True, timeout=7200)
    rates = [float(r) for r in out.stdout.split()]
    best = max(rates)
    print(table(f"bench real_rates: vLLM 0.32 on core 0, {args.max_tokens}-token answers, "
                f"each count kept in flight from core 1 ({args.window_s:.0f} s windows)",
                ["in flight", "tokens/s", "x best"],
                [[c, r, round(r / best, 3)] for c, r in zip(counts, rates, strict=True)]))
    if not args.no_save:
        path = save("real_rates", {"rates": [{"in_flight": c, "tokens_per_s": round(r, 1)}
                                             for c, r in zip(counts, rates, strict=True)]},
                    {"counts": args.counts, "max_tokens": args.max_tokens,
                     "warm_s": args.warm_s, "window_s": args.window_s,
                     "server": "vllm tier, core 0"})
        print(f"figures: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
