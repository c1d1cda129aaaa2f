"""The shared rules: when a run is complete, the CLI's error policy, durable outcomes."""

from __future__ import annotations

import logging

import pytest
import redis

from fleetgen import exitcodes
from fleetgen.cli import main as cli
from fleetgen.monitor import status
from fleetgen.queue.contract import KIND_RESULT
from fleetgen.runstate import lifecycle
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_PRODUCED
from workers.sink import StreamSink


def test_run_complete_needs_every_row_written_no_retry_and_an_empty_stream(
        rclient: redis.Redis) -> None:
    keys = RunKeys("r")
    assert not lifecycle.run_complete(rclient, "r")  # no manifest
    rclient.hset(keys.manifest, mapping={"state": STATE_PRODUCED, "total": 2})
    rclient.hset(keys.written, mapping={"done": 1, "failed": 0, "rejected": 0})
    assert not lifecycle.run_complete(rclient, "r")
    rclient.hset(keys.written, "failed", 1)
    assert lifecycle.run_complete(rclient, "r")
    rclient.sadd(keys.retrying, 2)  # `fleetgen retry` sent the failed row back
    assert not lifecycle.run_complete(rclient, "r")
    rclient.srem(keys.retrying, 2)
    rclient.xadd(keys.stream, {"k": KIND_RESULT, "d": b"{}"})  # not yet drained
    assert not lifecycle.run_complete(rclient, "r")
    assert not lifecycle.run_complete(rclient, "r", written=1)


def test_an_unexpected_error_is_logged_with_its_traceback_and_exits_70(
        redis_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    redis.Redis.from_url(redis_url).hset(RunKeys("r").manifest, "state", "producing")

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(status, "gather", broken)
    with caplog.at_level(logging.ERROR):
        code = cli.main(["status", "--run", "r", "--redis", redis_url])
    assert code == exitcodes.BUG == 70
    assert "a bug" in caplog.text and caplog.records[-1].exc_info is not None


def test_wait_aof_makes_an_outcome_durable_before_returning(rclient: redis.Redis) -> None:
    # The session's Valkey runs with appendonly yes, as production should.
    sink = StreamSink(rclient, worker="w@h", wait_aof=True)
    rclient.hset(RunKeys("r").manifest, "state", "producing")  # a run the sink writes for
    sink.emit("r", KIND_RESULT, 1, {"id": "a", "line": 1}, {"done": 1})
    assert rclient.getbit(RunKeys("r").done, 1) == 1
    rclient.config_set("appendonly", "no")
    try:
        with pytest.raises(redis.ResponseError, match="appendonly"):
            sink.emit("r", KIND_RESULT, 2, {"id": "b", "line": 2}, {"done": 1})
    finally:
        rclient.config_set("appendonly", "yes")
