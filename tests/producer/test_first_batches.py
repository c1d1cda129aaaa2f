"""A pass's first batches are small and double up to the batch size: the fleet gets its first
prompts once 16 rows (FIRST_BATCH) are tokenized, not a whole batch (issue 48)."""

from __future__ import annotations

from pathlib import Path

import redis

from fleetgen.queue.contract import QUEUE
from producer.progress import Progress
from tests.support.producers import prompts_producer


def test_batches_grow_from_the_first_to_the_batch_size(rclient: redis.Redis, redis_url: str,
                                                       tmp_path: Path) -> None:
    producer = prompts_producer(rclient, redis_url, tmp_path, "fb", 300, batch_size=100)
    read: list[int] = []

    def on_batch(progress: Progress) -> None:
        read.append(progress.read)

    producer.send_pass(on_batch)
    sizes = [b - a for a, b in zip([0, *read], read, strict=False)]
    assert sizes == [16, 32, 64, 100, 88]
    assert rclient.llen(QUEUE) == 300
