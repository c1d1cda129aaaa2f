"""A Redis that cannot persist (MISCONF, most often a full disk) is one line naming where, also
when the reply comes out of a pipeline, whose error names the failed command first (the
producer's batches are pipelines: a full disk at its first LPUSH was a traceback)."""

from __future__ import annotations

from pathlib import Path

import redis

from fleetgen.records.diskfull import from_redis_error

MISCONF = ("MISCONF Errors writing to the AOF file: No space left on device. Some commands "
           "are refused")


def test_a_misconf_reply_is_a_disk_full_naming_the_cause_and_the_place() -> None:
    full = from_redis_error(redis.ResponseError(MISCONF), Path("/data/valkey"))
    assert full is not None
    assert "/data/valkey" in str(full) and "No space left on device" in str(full)
    assert "Some commands" not in str(full)  # the cause only


def test_a_pipelines_misconf_is_one_too() -> None:
    text = f"Command # 1 (LPUSH fleetgen.to.gpu1@vm ...) of pipeline caused error: {MISCONF}"
    full = from_redis_error(redis.ResponseError(text), None)
    assert full is not None and "Errors writing to the AOF file" in str(full)
    assert "Command # 1" not in str(full)


def test_another_error_is_not() -> None:
    assert from_redis_error(redis.ResponseError("WRONGTYPE Operation against a key"),
                            None) is None
