"""What one drainer tick asks of Redis while a run is not finished: it runs about twice a
second for the whole run, so it reads the run's manifest once, for both ways a run ends
(complete, or stopped early and settled). Counted by Valkey itself (INFO commandstats)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.drainer import Drainer
from fleetgen.queue.redisconn import connect
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_PRODUCED, STATE_STOPPED


def _hgetall_calls(client: object) -> int:
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


@pytest.mark.parametrize("state", [STATE_PRODUCED, STATE_STOPPED])
def test_an_unfinished_tick_reads_the_manifest_once(redis_url: str, tmp_path: Path,
                                                    state: str) -> None:
    client = connect(redis_url)
    client.hset(RunKeys("tick").manifest, mapping={"state": state, "total": 5})
    client.setbit(RunKeys("tick").sent, 0, 1)  # one request sent, none written
    drainer = Drainer(connect(redis_url), "tick", tmp_path / "out", block_ms=1,
                      verify_s=3600)
    drainer.recover()
    assert drainer._tick(follow=False) is False  # the first tick also verifies
    client.config_resetstat()
    assert drainer._tick(follow=False) is False
    assert _hgetall_calls(client) == 1
    drainer.close()


def test_summary_counts_held_out_requests_and_rows() -> None:
    """`held out 63` for a 46-line holdout.jsonl: the tally counts the requests a line stands
    for and, beside them, the lines (rows); the terminal says both."""
    from fleetgen.cli.summary import held_out
    from fleetgen.drainer.store import Tally
    from fleetgen.queue.contract import KIND_HOLDOUT

    tally = Tally()
    tally.add(KIND_HOLDOUT, {"id": "a", "line": 0, "slot": 0, "slots": 4})
    tally.add(KIND_HOLDOUT, {"id": "b", "line": 1, "slot": 4, "slots": 1})
    tally.add(KIND_HOLDOUT, {"id": "a", "line": 0, "slot": 0, "slots": 4})  # sent again
    assert tally.by_kind[KIND_HOLDOUT] == 5 and len(tally.holdout_firsts) == 2
    assert held_out({"holdout": 5, "holdout_rows": 2}) == "5 requests (2 rows)"
