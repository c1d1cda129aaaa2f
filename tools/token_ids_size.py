"""Measure what `--token-ids` costs in the output (docs/formats.md "Token ids"): a real run
(`fleetgen demo --token-ids` on the bundled sample: Valkey, Celery workers, simulated GPUs, the
drainer), then `fleetgen export --format tokens` as JSONL and as Parquet, and bytes per token
of each.

The simulator's output ids are Qwen3.6's own ids of 64 common English words (3 to 5 digits);
a real model's answers look more like the prompts' ids (real text, measured here too).

    .venv/bin/python tools/token_ids_size.py [--gpus N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from fleetgen.queue.contract import KIND_RESULT
from fleetgen.records.outdir import OutputDir


def without_ids(record: dict[str, Any]) -> dict[str, Any]:
    """The record as it would be without --token-ids (the drainer writes orjson's bytes)."""
    return {k: v for k, v in record.items() if k not in ("output_ids", "prompt_ids_digest")}


def fleetgen(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "fleetgen", *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        fleetgen("demo", "--gpus", str(args.gpus), "--tpot-ms", "0.05", "--out", str(out),
                 "--token-ids")
        fleetgen("export", str(out), "--format", "tokens")
        fleetgen("export", str(out), "--format", "tokens", "--out", str(out / "t.parquet"))
        raw = OutputDir(out).file(KIND_RESULT).read_bytes()
        records = [orjson.loads(line) for line in raw.splitlines()]
        output = sum(r["completion_tokens"] for r in records)
        added = sum(len(orjson.dumps(r)) - len(orjson.dumps(without_ids(r))) for r in records)
        lines = [orjson.loads(line) for line in
                 (out / "export.tokens.jsonl").read_bytes().splitlines()]
        prompt_ids = [t for x in lines for t, m in zip(x["input_ids"], x["loss_mask"],
                                                       strict=True) if not m]
        total = sum(len(x["input_ids"]) for x in lines)
        print(f"{len(records)} answers, {output:,} output tokens, {len(prompt_ids):,} prompt "
              "tokens")
        print("| measured | bytes per token |")
        print("| --- | --- |")
        print(f"| `output_ids` + `prompt_ids_digest` in results.jsonl (simulated answers) | "
              f"{added / output:.1f} |")
        print(f"| the rest of the result line | {(len(raw) - added) / output:.1f} |")
        print(f"| the same list form over the prompts' ids (real text) | "
              f"{(len(orjson.dumps(prompt_ids)) - 1) / len(prompt_ids):.1f} |")
        tokens_jsonl = (out / "export.tokens.jsonl").stat().st_size
        tokens_parquet = (out / "t.parquet").stat().st_size
        print(f"| export.tokens.jsonl (prompt + answer, ids and mask) | "
              f"{tokens_jsonl / total:.1f} |")
        print(f"| the same as Parquet (`--out x.parquet`) | {tokens_parquet / total:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
