"""Measure what `--logprobs K` costs in the output: bytes per output token of a result line,
and of its `logprobs` field alone, for several K (docs/formats.md "Thinking, JSON, logprobs").

Answers come from the simulator through the real SGLang client and the worker's record builder,
so the record is byte for byte what the drainer writes; the simulator's ids are spread over the
whole Qwen3 vocabulary (6 digits mostly) and its logprobs look like a confident model's (the
chosen token near 0, the runners-up a few nats below).

    .venv/bin/python tools/logprobs_size.py [--rows N] [--mean-tokens M] [K ...]
"""

from __future__ import annotations

import argparse

import orjson

from fleetgen.engine import GenerateOptions
from fleetgen.engine.sglang import SGLangClient
from fleetgen.queue.contract import TaskPayload
from fleetgen.records.outcomes import result_record
from fleetgen.simulator import SimConfig, run_in_thread


def measure(url: str, rows: int, top: int) -> tuple[float, float, int]:
    """(record bytes per token, logprobs bytes per token, tokens) over `rows` answers."""
    client = SGLangClient(url, timeout_s=60, concurrency=1)
    line_bytes = logprob_bytes = tokens = 0
    try:
        for row in range(rows):
            ids = [1000 + row, 2000 + row, 3000 + row]
            payload = TaskPayload(run="size", line=row + 1, id=f"r{row}", input_ids=ids,
                                  max_tokens=4000, sampling={}, row={}, logprobs=top)
            gen = client.generate(ids, 4000, {}, f"size:{row}",
                                  GenerateOptions(logprobs=top))
            record = result_record(payload, gen, max_tokens=4000, attempts=1, worker="gpu0@h")
            line_bytes += len(orjson.dumps(record)) + 1
            logprob_bytes += len(orjson.dumps(record.get("logprobs"))) if top else 0
            tokens += gen.completion_tokens
    finally:
        client.close()
    return line_bytes / tokens, logprob_bytes / tokens, tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--mean-tokens", type=int, default=300)
    parser.add_argument("k", nargs="*", type=int, default=[0, 1, 5, 20])
    args = parser.parse_args(argv)
    config = SimConfig(port=0, ttft_ms=0, tpot_ms=0, health_delay_s=0, context_length=8192,
                       output_tokens_mean=args.mean_tokens)
    print("| K | bytes per output token, whole line | of which `logprobs` | tokens |")
    print("| --- | --- | --- | --- |")
    with run_in_thread(config) as sim:
        for top in args.k:
            line, logprobs, tokens = measure(sim.url, args.rows, top)
            print(f"| {top} | {line:.1f} | {logprobs:.1f} | {tokens:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
