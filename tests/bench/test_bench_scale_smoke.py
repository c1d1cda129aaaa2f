"""The scale benches run end to end at a tiny size and their figures are sane: one GPU's pool
as one and as two processes (every request answered), the central path (every row written,
the Redis commands of a row counted), and the regression guard (a first run records, a run
past the threshold fails and leaves the recorded figure as it was)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench import central, fleet_scale, gpu_pool, guard
from tests.support.figures import figures


def test_gpu_pool_one_and_two_processes(figures_dir: Path) -> None:
    assert gpu_pool.main(["--requests", "60", "--rounds", "1", "--processes", "1,2"]) == 0
    shapes = figures(figures_dir, "gpu")["shapes"]
    assert set(shapes) == {"1", "2"}
    for shape in shapes.values():
        assert shape["requests_per_s"] > 0 and shape["workers_cpu_ms_per_request"] > 0
    assert shapes["1"]["over_first"] == 1.0


def test_central_path_writes_every_row_and_counts_commands(figures_dir: Path) -> None:
    assert central.main(["--rows", "300", "--consumers", "2"]) == 0
    data = figures(figures_dir, "central")
    assert data["written"] == 300 and data["rows_per_s"] > 0
    per_row = data["redis_commands_per_row"]
    # Each row is taken and acked as the worker does (fleetgen/queue/broker.py): the take
    # script (EVAL), the record popping it off the taking list (RPOP) and the ack, both
    # EVALSHA with the outcome's script; kombu's BRPOP never. One outcome (its XADD), and two
    # done-bit questions: before the generation, and inside the outcome script, which writes
    # nothing for a row already done.
    assert "brpop" not in per_row, per_row
    for command in ("eval", "rpop", "xadd"):
        assert per_row[command] == pytest.approx(1.0, abs=0.05), per_row
    assert per_row["evalsha"] == pytest.approx(3.0, abs=0.05), per_row
    assert per_row["getbit"] == pytest.approx(2.0, abs=0.05), per_row
    assert data["redis_bytes_in_per_row"] > 1000  # a ~300-token task message at least


def test_guard_records_then_fails_past_the_threshold(figures_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert guard.main(["--rows", "100", "--gpus", "1"]) == 0
    first = figures(figures_dir, "guard")
    assert first["verdict"] == "new" and first["cost_in_units"] > 0
    # The same pipeline recorded at a third of its cost: the next run is past the failure
    # threshold (1.25 x) unless it costs less than 0.42 x this one, far outside the noise of
    # so small a run.
    recorded = {**first, "cost_in_units": first["cost_in_units"] / 3}
    (figures_dir / "guard.json").write_bytes(orjson.dumps(recorded))
    assert guard.main(["--rows", "100", "--gpus", "1"]) == 1
    assert figures(figures_dir, "guard")["cost_in_units"] == recorded["cost_in_units"]
    assert guard.verdict(1.0, 1.0) == ("ok", 1.0)
    assert guard.verdict(1.2, 1.0)[0] == "warn" and guard.verdict(1.3, 1.0)[0] == "fail"


def test_fleet_scale_holds_every_workers_pool_and_measures_valkey(figures_dir: Path) -> None:
    """Eight emulated workers in two processes: each holds its K + 1 prompts through kombu,
    rows are written, and the figures say what Valkey did meanwhile."""
    assert fleet_scale.main(["--workers", "8", "--window-s", "6", "--processes", "2"]) == 0
    (r,) = figures(figures_dir, "fleet-scale")["results"]
    # Each holds its pool, less at most one it is refilling at the end of the window.
    pools = 8 * fleet_scale.SLOTS
    assert r["workers"] == 8 and pools - 8 <= r["in_flight"] <= pools
    assert r["rows_per_s"] > 0 and 0 < r["valkey_main_thread_busy"] < 1
    assert r["ping_ms"]["count"] >= 10 and 0 < r["ping_ms"]["p50"] <= r["ping_ms"]["max"]
    # Every worker beat (HSET of its heartbeat) and answered (the outcome's XADD).
    assert r["commands_per_s"]["hset"] > 0 and r["commands_per_s"]["xadd"] > 0
    assert r["valkey_memory_bytes"]["unacked_hash"] > 8 * fleet_scale.SLOTS * 1000
