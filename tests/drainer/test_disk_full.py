"""A full disk under the drainer (ENOSPC on a small tmpfs, EFBIG past the file-size limit): one
DiskFull naming the file, nothing acknowledged that is not in the files, no torn line, and a
drainer started again once there is room writes the rest, every row once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

from fleetgen.drainer import Drainer
from fleetgen.errors import DiskFull
from fleetgen.queue.contract import DRAINER_GROUP, KIND_RESULT
from fleetgen.queue.redisconn import connect
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import RunManifest
from tests.support.disk import file_size_limit, small_disk
from tests.support.pipeline import assert_exactly_once, read_output
from workers.sink import StreamSink

ROWS = 120
LINE_BYTES = 1000  # a result line of about 1 KB: the 48 KiB below hold some, not all
ROOM = 48 * 1024


def emit_results(client: redis.Redis, run: str) -> None:
    """ROWS results in the run's stream, as workers write them."""
    record = RunManifest(client, run)
    record.start({})
    record.close(ROWS)
    sink = StreamSink(client, worker="gpu0")
    for line in range(1, ROWS + 1):
        sink.emit(run, KIND_RESULT, line, {"id": f"r{line}", "line": line,
                                           "completion": "x" * LINE_BYTES,
                                           "finish_reason": "stop"}, {"done": 1})


@contextmanager
def full(how: str, where: Path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """The output directory, on a disk that is full past ROOM bytes, and what makes room (the
    tmpfs grown in place, or the limit lifted); the disk is there until the block ends."""
    with ExitStack() as stack:
        if how == "ENOSPC":
            disk = stack.enter_context(small_disk(where / "disk", f"{ROOM}"))
            yield disk.path / "out", lambda: disk.grow("16m")
        else:
            limit = stack.enter_context(ExitStack())
            limit.enter_context(file_size_limit(ROOM))
            yield where / "out", limit.close


@pytest.mark.parametrize("how", ["ENOSPC", "EFBIG"])
def test_a_full_disk_acknowledges_nothing_unwritten_and_the_next_drainer_writes_the_rest(
        redis_url: str, tmp_path: Path, how: str) -> None:
    client = connect(redis_url)
    run = "disk"
    emit_results(client, run)
    keys = RunKeys(run)
    with full(how, tmp_path) as (out, make_room):
        # Small batches: some are written before the disk is full.
        drainer = Drainer(connect(redis_url), run, out, batch=16, block_ms=10)
        drainer.recover()
        with pytest.raises(DiskFull) as raised:
            drainer.run_until_complete()
        drainer.close()
        make_room()
        message = str(raised.value)
        assert str(out / "results.jsonl") in message and "run the same command" in message
        assert ("no space left" if how == "ENOSPC" else "file-size limit") in message
        written = len(read_output(out)["results"])  # whole lines only: no torn tail
        assert 0 < written < ROWS, f"{how} did not land mid-run: {written} of {ROWS} written"
        # Every entry the files do not hold is still in the stream, unacknowledged or unread.
        assert client.xlen(keys.stream) == ROWS - written
        pending = client.xpending(keys.stream, DRAINER_GROUP)["pending"]
        assert pending == 16, "the batch the disk refused is still the drainer's to write"
        again = Drainer(connect(redis_url), run, out, batch=16, block_ms=10)
        again.recover()
        again.run_until_complete()
        again.close()
        data = assert_exactly_once(out, {f"r{line}" for line in range(1, ROWS + 1)})
        assert len(data["results"]) == ROWS
        assert client.xlen(keys.stream) == 0
        print(f"\n{how}: {written} of {ROWS} rows written when the disk was full; the next "
              f"drainer wrote the other {ROWS - written}, each once")
