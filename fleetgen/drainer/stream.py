"""The drainer's stream consumer: the run's stream read through its consumer group, in
batches, and each batch acked and deleted once the caller has written it durably."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import redis

from fleetgen.queue.contract import DRAINER_GROUP
from fleetgen.records.outcomes import read_entry
from fleetgen.runstate.keys import RunKeys

CONSUMER = "drainer"
Entry = tuple[bytes, dict[bytes, bytes]]


def outcomes(entries: list[Entry]) -> Iterator[tuple[str, bytes]]:
    """(kind, the worker's one-line JSON) of each entry that holds an outcome."""
    for _, fields in entries:
        entry = read_entry(fields)
        if entry is not None:
            yield entry


class StreamConsumer:
    def __init__(self, client: redis.Redis, keys: RunKeys, batch: int) -> None:
        self.redis = client
        self.keys = keys
        self.batch = batch

    def ensure_group(self) -> None:
        try:
            self.redis.xgroup_create(self.keys.stream, DRAINER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, read_id: str = ">", block_ms: int | None = 1000) -> list[Entry]:
        """One batch: new entries (">"), or our own read-but-unacked ones ("0")."""
        reply: Any = self.redis.xreadgroup(DRAINER_GROUP, CONSUMER,
                                           {self.keys.stream: read_id},
                                           count=self.batch, block=block_ms)
        return reply[0][1] if reply else []

    def forget(self, entries: list[Entry], also: Callable[[Any], None]) -> None:
        """Ack and delete `entries` (written and fsynced: the stream forgets them), in one
        round trip with whatever `also` adds to the pipeline."""
        ids = [entry_id for entry_id, _ in entries]
        pipe = self.redis.pipeline(transaction=False)
        pipe.xack(self.keys.stream, DRAINER_GROUP, *ids)
        pipe.xdel(self.keys.stream, *ids)
        also(pipe)
        pipe.execute()
