"""The plain client of `bench real`: what a careful one-file script does against one OpenAI-
protocol server. asyncio + httpx, `concurrency` requests in flight (a semaphore), the prompts'
token ids sent to /v1/completions with one max_tokens; no retries, no budget, no bookkeeping.

`python -m bench.plain_client URL IDS.json CONCURRENCY MAX_TOKENS` prints one JSON object: the
makespan (first request sent to last answer), the tokens generated, and each request's start
and end (seconds from the first send), from which `bench real` draws the in-flight counts.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import httpx
import orjson


async def _one(client: httpx.AsyncClient, gate: asyncio.Semaphore, ids: list[int],
               max_tokens: int, t0: float, spans: list[tuple[float, float, int]]) -> None:
    async with gate:
        started = time.monotonic() - t0
        response = await client.post("/v1/completions", content=orjson.dumps(
            {"model": "tiny", "prompt": ids, "max_tokens": max_tokens}),
            headers={"Content-Type": "application/json"})
        response.raise_for_status()
        tokens = int(response.json()["usage"]["completion_tokens"])
        spans.append((started, time.monotonic() - t0, tokens))


async def run(url: str, prompts: list[list[int]], concurrency: int,
              max_tokens: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    spans: list[tuple[float, float, int]] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=900) as client:
        gate = asyncio.Semaphore(concurrency)
        t0 = time.monotonic()
        await asyncio.gather(*(_one(client, gate, ids, max_tokens, t0, spans)
                               for ids in prompts))
        makespan_s = time.monotonic() - t0
    return {"concurrency": concurrency, "makespan_s": round(makespan_s, 3),
            "completion_tokens": sum(s[2] for s in spans),
            "spans": [[round(a, 3), round(b, 3)] for a, b, _ in spans]}


def main(argv: list[str]) -> int:
    url, ids_path, concurrency, max_tokens = argv[0], argv[1], int(argv[2]), int(argv[3])
    with open(ids_path, "rb") as f:
        prompts = orjson.loads(f.read())
    result = asyncio.run(run(url, prompts, concurrency, max_tokens))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
