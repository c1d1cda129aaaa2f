"""The engine call's CPU: httpx's `Client.post` against `ThreadPosts` (fleetgen/engine/http.py),
the same requests to the same zero-latency simulator, in one run.

Run from the repository root: `python -m bench.http_client [--requests N] [--rounds R]`.
One thread, one kept-alive connection each way, the worker's body (300 prompt token ids,
orjson) and its reading of the answer (orjson). The two ways alternate (`--rounds`) so a
change of the machine's load hits both; CPU is this process's CPU time. It decided the
worker's engine call: a Client per thread (what the worker did before) or its transport.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common import self_cpu_s
from fleetgen.engine.http import JSON_HEADERS, ThreadPosts
from fleetgen.local.procs import ProcessGroup
from fleetgen.local.simgpus import SimGpus

PROMPT_TOKENS = 300
TIMEOUT = httpx.Timeout(60.0, connect=5.0)

Post = Callable[[bytes], Any]


def client_post(url: str) -> tuple[Post, Callable[[], None]]:
    client = httpx.Client(base_url=url, timeout=TIMEOUT,
                          limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    def post(body: bytes) -> Any:
        return orjson.loads(client.post("/generate", content=body, headers=JSON_HEADERS).content)
    return post, client.close


def thread_post(url: str) -> tuple[Post, Callable[[], None]]:
    posts = ThreadPosts(url, headers={}, timeout=TIMEOUT)

    def post(body: bytes) -> Any:
        return orjson.loads(posts.post("/generate", body).content)
    return post, posts.close


WAYS: dict[str, Callable[[str], tuple[Post, Callable[[], None]]]] = {
    "httpx.Client.post": client_post, "ThreadPosts.post (the transport)": thread_post}


def bodies(count: int) -> list[bytes]:
    rng = random.Random(0)
    ids = [rng.randrange(100, 150_000) for _ in range(PROMPT_TOKENS)]
    return [orjson.dumps({"input_ids": ids, "rid": f"b:{i}", "stream": False,
                          "sampling_params": {"max_new_tokens": 300, "temperature": 0.0}})
            for i in range(count)]


def measure(url: str, requests: int, rounds: int) -> dict[str, Any]:
    """CPU ms a request of each way, summed over the rounds; the answers must be the same."""
    sent = bodies(requests)
    cpu = dict.fromkeys(WAYS, 0.0)
    answers: dict[str, list[str]] = {}
    for _ in range(rounds):
        for name, make in WAYS.items():
            post, close = make(url)
            post(sent[0])  # connect outside the clock
            start = self_cpu_s()
            got = [post(body)["text"] for body in sent]
            cpu[name] += self_cpu_s() - start
            close()
            answers.setdefault(name, got)
    first, second = answers.values()
    if first != second:
        raise RuntimeError("the two ways got different answers to the same requests")
    per = {name: 1000 * s / (requests * rounds) for name, s in cpu.items()}
    old, new = per.values()
    return {"cpu_ms_per_request": per, "ratio": new / old, "requests": requests,
            "rounds": rounds}


def run(requests: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleetgen-bench-http-") as tmp:
        procs = ProcessGroup(Path(tmp) / "logs")
        try:
            urls = SimGpus(gpus=1, ttft_ms=0, tpot_ms=0).start(procs, 60.0)
            return measure(urls[0], requests, rounds)
        finally:
            procs.stop_all()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result = run(args.requests, args.rounds)
    for name, ms in result["cpu_ms_per_request"].items():
        print(f"{name:<36} {ms:6.3f} ms CPU / request")
    print(f"ThreadPosts / Client.post: {result['ratio']:.2f} "
          f"({args.rounds} x {args.requests:,} requests each, one thread)")


if __name__ == "__main__":
    main()
