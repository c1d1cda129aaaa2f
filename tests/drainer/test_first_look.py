"""A drainer's first look at a Redis that holds nothing of its run (a finished run's state is
deleted, so each rerun starts on a fresh Valkey) marks the written requests done and says so
as info; only a Redis that had the run and lost bits of it is warned about."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fleetgen.drainer import Drainer
from fleetgen.queue.redisconn import connect
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_PRODUCED
from tests.support.outdir import RUN, write_output_dir


def recover(redis_url: str, out: Path) -> Drainer:
    drainer = Drainer(connect(redis_url), RUN, out, block_ms=1, verify_s=3600)
    drainer.recover()
    drainer.close()
    return drainer


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records
            if r.name.startswith("fleetgen.drainer")]


def test_a_fresh_redis_learns_the_files_as_info(redis_url: str, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    out = write_output_dir(tmp_path / "out")
    client = connect(redis_url)
    client.delete(*RunKeys(RUN).all())
    client.hset(RunKeys(RUN).manifest, mapping={"state": STATE_PRODUCED, "total": 16})
    with caplog.at_level(logging.INFO):
        recover(redis_url, out)
    lines = said(caplog)
    assert not [m for level, m in lines if level >= logging.WARNING], lines
    (info,) = [m for _, m in lines if "already" in m]
    assert info.startswith("the output files hold ") and "none is sent again" in info
    assert client.bitcount(RunKeys(RUN).done) > 0  # what the files hold is marked done

    # Now Redis has the run and loses some of its bits: that one is a warning.
    client.setbit(RunKeys(RUN).done, 1, 0)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        recover(redis_url, out)
    assert [(level, m) for level, m in said(caplog) if "lost" in m] == [
        (logging.WARNING, "restored 1 done bit(s) that Redis had lost, from the output files")]
