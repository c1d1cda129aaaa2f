"""The seed's way, for comparison: static shards, fixed max_new_tokens, asyncio + httpx, one writer.

Prompt i of n goes to server i * servers // n (contiguous shards, decided up front), each
server gets at most K requests at a time, every request asks for max_new_tokens=4096
whatever the prompt's length, and one task appends the answers to a JSONL file. No retries,
no budget, no rebalancing: what a careful one-file script does.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

FIXED_MAX_NEW_TOKENS = 4096


@dataclass
class BaselineResult:
    makespan_s: float
    completed: int = 0
    failed: int = 0
    truncated: int = 0
    context_length_failures: int = 0
    completion_tokens: int = 0
    failures_by_status: dict[str, int] = field(default_factory=dict)


def shard(count: int, servers: int) -> list[int]:
    """Server index of each prompt: contiguous blocks of count/servers prompts."""
    return [i * servers // count for i in range(count)]


async def _one(client: httpx.AsyncClient, gate: asyncio.Semaphore, row_id: str,
               input_ids: list[int], out: asyncio.Queue[dict[str, Any] | None]) -> None:
    body = {"input_ids": input_ids, "rid": row_id,
            "sampling_params": {"max_new_tokens": FIXED_MAX_NEW_TOKENS, "temperature": 0.0}}
    async with gate:
        try:
            response = await client.post("/generate", json=body)
        except httpx.HTTPError as exc:
            await out.put({"id": row_id, "error": type(exc).__name__, "status": None})
            return
    if response.status_code != 200:
        message = response.json().get("error", {}).get("message", "") if response.content else ""
        await out.put({"id": row_id, "error": message[:200], "status": response.status_code})
        return
    data = response.json()
    meta = data["meta_info"]
    await out.put({"id": row_id, "completion": data["text"],
                   "finish_reason": meta["finish_reason"]["type"],
                   "prompt_tokens": meta["prompt_tokens"],
                   "completion_tokens": meta["completion_tokens"]})


async def _writer(path: Path, out: asyncio.Queue[dict[str, Any] | None],
                  result: BaselineResult) -> None:
    with path.open("wb") as f:
        while (record := await out.get()) is not None:
            f.write(orjson.dumps(record) + b"\n")
            if "error" in record:
                result.failed += 1
                status = str(record["status"])
                result.failures_by_status[status] = result.failures_by_status.get(status, 0) + 1
                result.context_length_failures += record["status"] == 400
            else:
                result.completed += 1
                result.truncated += record["finish_reason"] == "length"
                result.completion_tokens += record["completion_tokens"]


async def run_baseline(urls: list[str], rows: list[tuple[str, list[int]]], concurrency: int,
                       out_path: Path, timeout_s: float = 600.0) -> BaselineResult:
    """Send every (id, input_ids) to its shard's server; returns counts and the makespan."""
    result = BaselineResult(makespan_s=0.0)
    out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    clients = [httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s)
               for url in urls]
    gates = [asyncio.Semaphore(concurrency) for _ in urls]
    writer = asyncio.create_task(_writer(out_path, out, result))
    started = time.perf_counter()
    try:
        await asyncio.gather(*(
            _one(clients[server], gates[server], row_id, ids, out)
            for (row_id, ids), server in zip(rows, shard(len(rows), len(urls)), strict=True)))
        await out.put(None)
        await writer
    finally:
        for client in clients:
            await client.aclose()
    result.makespan_s = time.perf_counter() - started
    return result
