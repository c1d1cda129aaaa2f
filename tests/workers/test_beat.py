"""The worker's beat thread (workers/beat.py): a loss of Valkey and its return are each said
once at WARNING (issue 52: failed heartbeats were DEBUG lines, so a 30 s cut left no trace in
a worker's log), the loss even while the beat itself still waits on a dead link; the consumer
loop reads the beat's result and never calls Valkey for it."""

from __future__ import annotations

import logging
import threading

import pytest
import redis

from workers.beat import Beat


class Link:
    """A fake Valkey link and clock: `up` decides whether a beat gets through."""

    def __init__(self) -> None:
        self.up, self.now, self.sent = True, 1000.0, 0

    def send(self) -> str | None:
        self.sent += 1
        if not self.up:
            raise redis.ConnectionError("Timeout connecting to server")
        return None


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(("cut_s", "lapsed"), [(30.0, False), (180.0, True)])
def test_a_loss_and_a_return_are_each_said_once(caplog: pytest.LogCaptureFixture,
                                                cut_s: float, lapsed: bool) -> None:
    link = Link()
    beat = Beat(link.send, worker="gpu0@h", interval_s=2.0, lease_s=60.0, held=lambda: 7,
                clock=lambda: link.now)
    caplog.set_level(logging.DEBUG, logger="fleetgen.worker")
    beat.once()
    link.up = False
    for _ in range(2):  # two failed beats: not lost yet (status says LOST after 3 intervals)
        link.now += 2.0
        beat.once()
    assert _warnings(caplog) == []
    for _ in range(int(cut_s / 2.0) - 2):
        link.now += 2.0
        beat.once()
    (lost,) = _warnings(caplog)
    assert lost.startswith("fleetgen worker gpu0@h: Valkey lost: no heartbeat has reached it "
                           "for 8 s (ConnectionError: Timeout connecting to server)")
    assert "it holds 7 prompt(s)" in lost
    link.up = True
    link.now += 2.0
    beat.once()
    link.now += 2.0
    beat.once()
    lost_again, back = _warnings(caplog)
    assert lost_again == lost
    assert back.startswith(f"fleetgen worker gpu0@h: Valkey back after {cut_s + 2:.0f} s")
    assert ("its lease lapsed meanwhile" in back) is lapsed
    assert ("its lease held" in back) is not lapsed


def test_a_loss_is_said_from_the_loop_while_the_beat_waits(
        caplog: pytest.LogCaptureFixture) -> None:
    """A cut link without a RST: the beat's call waits for its socket timeout and retries.
    The loop's `check` (the health gate's timer) says the loss meanwhile, without waiting."""
    now = [0.0]
    entered, release = threading.Event(), threading.Event()

    def blocked() -> str | None:
        entered.set()
        release.wait(10)
        raise redis.TimeoutError("Timeout reading from socket")

    beat = Beat(blocked, worker="gpu1@h", interval_s=2.0, lease_s=60.0, held=lambda: 3,
                clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="fleetgen.worker")
    thread = threading.Thread(target=beat.once, daemon=True)
    thread.start()
    assert entered.wait(5)
    now[0] = 7.0
    beat.check()  # what the gate's timer calls on the consumer loop: it returns at once
    (lost,) = _warnings(caplog)
    assert "Valkey lost: no heartbeat has reached it for 7 s (no reply)" in lost
    release.set()
    thread.join(5)
    assert len(_warnings(caplog)) == 1


def test_the_closing_key_is_read_from_the_last_beat() -> None:
    beat = Beat(lambda: "run-9", worker="w", interval_s=2.0, lease_s=60.0, held=lambda: 0)
    assert beat.closing is None
    beat.once()
    assert beat.closing == "run-9"
