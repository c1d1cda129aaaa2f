"""A producer over a file of short prompts, built in the test's own process as `fleetgen
produce` builds one (settings, the qwen3.6 tokenizer, an Enqueuer, the limits, a plan over the
input resolved once), for tests that drive its pass and its wait by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from producer.build import resolve_limits
from producer.enqueue import Enqueuer
from producer.inputs import resolve_input
from producer.loop import Plan, Producer
from producer.settings import ProducerSettings
from producer.tokenizer import load_tokenizer


def prompts_producer(client: redis.Redis, redis_url: str, tmp_path: Path, run: str,
                     rows: int, **settings: Any) -> Producer:
    """Rows `r0`..`r<rows-1>` ("q 0", ...) in tmp_path/p.jsonl, for run `run`, at a context
    of 4,096 unless `settings` say otherwise."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "r{i}", "prompt": "q {i}"}}\n' for i in range(rows)))
    config = ProducerSettings(input=prompts, run=run, redis_url=redis_url,
                              **{"context_length": 4096, **settings})
    return Producer(config, load_tokenizer("qwen3.6"), client, Enqueuer(client, run),
                    resolve_limits(config), Plan(resolve_input(prompts)))
