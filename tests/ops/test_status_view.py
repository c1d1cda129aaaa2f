"""The live status view: windowed rates and ETA between refreshes, and the table's columns."""

from __future__ import annotations

from fleetgen.monitor.status import RunStatus, WorkerStatus, _health, render, with_window


def snapshot(at: float, done: int, tokens: int, workers: list[WorkerStatus]) -> RunStatus:
    return RunStatus(run="r", state="produced", total=1000, read=1000, queued=40, in_flight=16,
                     done=done, failed=0, rejected=10, truncated=done // 10, retries=0,
                     prompt_tokens=0, completion_tokens=tokens, written=done, elapsed_s=at,
                     rows_per_s=done / at, tokens_per_s=tokens / at, eta_s=None, at=at,
                     workers=workers)


def test_watch_rates_and_eta_come_from_the_last_interval() -> None:
    def w(name: str, done: int = 0) -> WorkerStatus:
        return WorkerStatus(name, done=done, completion_tokens=100 * done)

    before = snapshot(100.0, 500, 50_000, [w("gpu0@h", 300), w("gpu1@h", 200)])
    # gpu1 stalled: the average since the start would hide it, the window shows it.
    after = snapshot(110.0, 600, 60_000, [w("gpu0@h", 400), w("gpu1@h", 200), w("gpu2@h")])
    s = with_window(after, before)
    assert s.recent_rows_per_s == 10.0 and s.recent_tokens_per_s == 1000.0
    assert s.eta_s == 39.0  # (1000 - 600 - 10) rows at 10 rows/s
    rates = {w.name: w.recent_rows_per_s for w in s.workers}
    assert rates == {"gpu0@h": 10.0, "gpu1@h": 0.0, "gpu2@h": None}  # gpu2 is new
    assert with_window(snapshot(5.0, 1, 1, []), None).recent_rows_per_s is None


def test_table_shows_in_flight_health_and_truncation() -> None:
    workers = [WorkerStatus("gpu0@h", done=7, in_flight=3, concurrency=8, healthy=True,
                            consuming=True),
               WorkerStatus("gpu1@h", done=2, in_flight=0, concurrency=8, healthy=False,
                            consuming=False),
               WorkerStatus("gpu2@h", done=1)]
    for w in workers:  # the health that gather gives each from its heartbeat
        w.health = _health(w, age_s=0.0)
    text = render(snapshot(10.0, 10, 1000, workers))
    assert "queue depth 40" in text and "in flight 16" in text
    assert "truncated 1 (10.0%)" in text and "average since start" in text
    lines = {line.split()[0]: line for line in text.splitlines()[6:]}
    assert "3/8" in lines["gpu0@h"] and lines["gpu0@h"].endswith("ok")
    assert lines["gpu1@h"].endswith("ENGINE DOWN") and lines["gpu2@h"].endswith("offline")


def test_held_out_requests_are_settled_not_remaining() -> None:
    """Held-out rows vanished from the counts: the watch's ETA counted their requests as
    still to come, and the table did not show them."""
    before = snapshot(100.0, 500, 50_000, [])
    after = snapshot(110.0, 600, 60_000, [])
    after.holdout = before.holdout = 90
    s = with_window(after, before)
    assert s.remaining == 1000 - 600 - 10 - 90 and s.eta_s == 30.0
    assert "held out 90 requests" in render(s)
