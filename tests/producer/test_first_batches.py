"""A pass's first batches are small and double up to the batch size: the fleet gets its first
prompts once 16 rows (FIRST_BATCH) are tokenized, not a whole batch (issue 48)."""

from __future__ import annotations

from pathlib import Path

import redis

from fleetgen.queue.contract import QUEUE
from producer.build import resolve_limits
from producer.enqueue import Enqueuer
from producer.inputs import resolve_input
from producer.loop import Plan, Producer
from producer.progress import Progress
from producer.settings import ProducerSettings
from producer.tokenizer import load_tokenizer


def test_batches_grow_from_the_first_to_the_batch_size(rclient: redis.Redis, redis_url: str,
                                                       tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "r{i}", "prompt": "q {i}"}}\n' for i in range(300)))
    settings = ProducerSettings(input=prompts, run="fb", redis_url=redis_url,
                                context_length=4096, batch_size=100)
    producer = Producer(settings, load_tokenizer("qwen3.6"), rclient,
                        Enqueuer(rclient, "fb"), resolve_limits(settings),
                        Plan(resolve_input(prompts)))
    read: list[int] = []

    def on_batch(progress: Progress) -> None:
        read.append(progress.read)

    producer.send_pass(on_batch)
    sizes = [b - a for a, b in zip([0, *read], read, strict=False)]
    assert sizes == [16, 32, 64, 100, 88]
    assert rclient.llen(QUEUE) == 300
