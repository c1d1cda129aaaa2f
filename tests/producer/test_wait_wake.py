"""The producer's wait ends as soon as the drainer beside it has written every row
(`Producer.wake`, called by `Beside.settle`), not at its next look up to half a second later:
`fleetgen run` and the fleet bench end only when the producer's thread does (issue 48)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import redis

from fleetgen.cli.beside import Beside
from fleetgen.runstate.keys import RunKeys
from tests.support.producers import prompts_producer


def test_settle_wakes_the_producers_wait(rclient: redis.Redis, redis_url: str,
                                         tmp_path: Path) -> None:
    producer = prompts_producer(rclient, redis_url, tmp_path, "wk", 5)
    looked = threading.Event()

    def work() -> None:
        producer.send_pass()
        looked.set()
        producer.wait_until_generated(interval_s=30.0)  # a look every 0.5 s

    beside = Beside(work, wake=producer.wake)
    assert looked.wait(30)
    time.sleep(0.1)  # its first look saw nothing done: it is in its pause
    for line in range(1, 6):  # every row written
        rclient.setbit(RunKeys("wk").done, line, 1)
    started = time.monotonic()
    beside.settle(stopped=False)
    assert not beside.thread.is_alive()
    assert time.monotonic() - started < 0.3  # not the rest of its 0.5 s pause
