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


class _Pauses(threading.Event):
    """The producer's pause between looks (`_woken`), each one kept: (began, woken)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[tuple[float, bool]] = []

    def wait(self, timeout: float | None = None) -> bool:
        began = time.monotonic()
        woken = super().wait(timeout)
        self.kept.append((began, woken))
        return woken


def _settle_in_the_pause(rclient: redis.Redis, redis_url: str, where: Path,
                         run: str) -> tuple[float, bool, float]:
    """One case: the producer waits on run `run`, every row is written while it pauses, and
    `settle` is called. Returns (its last pause began, woken, settle called)."""
    where.mkdir()
    producer = prompts_producer(rclient, redis_url, where, run, 5)
    pauses = producer._woken = _Pauses()
    looked = threading.Event()

    def work() -> None:
        producer.send_pass()
        looked.set()
        producer.wait_until_generated(interval_s=30.0)  # a look every 0.5 s

    beside = Beside(work, wake=producer.wake)
    assert looked.wait(30)
    time.sleep(0.1)  # its first look saw nothing done: it is in its pause
    for line in range(1, 6):  # every row written
        rclient.setbit(RunKeys(run).done, line, 1)
    settled_at = time.monotonic()
    beside.settle(stopped=False)
    assert not beside.thread.is_alive()
    began, woken = pauses.kept[-1]
    return began, woken, settled_at


def test_settle_wakes_the_producers_wait(rclient: redis.Redis, redis_url: str,
                                         tmp_path: Path) -> None:
    """Judged by how the last pause ended, not by a time bound a stalled machine can pass:
    without `wake` it runs its 0.5 s out. A pause that began over 0.4 s before the settle may
    have run out first on its own; then the case proves nothing and is played again."""
    for attempt in range(5):
        began, woken, settled_at = _settle_in_the_pause(rclient, redis_url,
                                                        tmp_path / f"wk{attempt}", f"wk{attempt}")
        if began > settled_at - 0.4:
            assert woken, "the last pause ran its 0.5 s out: settle did not wake it"
            return
    raise AssertionError("in 5 attempts each last pause began too early to judge")
