"""Task events are off in a worker by default (they cost about a sixth of its CPU per prompt and
nothing in fleetgen reads them), and Flower's `enable_events` broadcast still turns them on:
the worker's event dispatcher is there for its heartbeats, with the task group left out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleetgen.queue.celeryconf import make_app
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import SimThread, run_in_thread
from tests.support.waiting import wait_until
from tests.support.workers import heartbeat_key, start_worker, stop

# Starts real Celery worker processes: the fleet tier (tests/conftest.py).
pytestmark = pytest.mark.fleet


@pytest.fixture()
def sim() -> Iterator[SimThread]:
    with run_in_thread(SimConfig(port=0, max_running_requests=2)) as handle:
        yield handle


def test_task_events_are_off_until_flower_enables_them(redis_url: str, sim: SimThread,
                                                       tmp_path: Path) -> None:
    proc = start_worker(redis_url, sim.url, "events", tmp_path / "w.log", concurrency=2)
    app = make_app(redis_url, visibility_timeout_s=7200)
    try:
        client = redis.Redis.from_url(redis_url)
        wait_until(lambda: client.exists(heartbeat_key("events")) == 1, 60, "the heartbeat")
        # What Flower sends every 5 s (flower/events.py `on_enable_events`).
        first = app.control.enable_events(reply=True, timeout=10)
        again = app.control.enable_events(reply=True, timeout=10)
    finally:
        app.close()
        stop(proc)
    assert [next(iter(r.values())) for r in first] == [{"ok": "task events enabled"}]
    assert [next(iter(r.values())) for r in again] == [{"ok": "task events already enabled"}]
