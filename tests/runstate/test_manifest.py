"""fleetgen/runstate/manifest.py owns the run's manifest: its fields as a type, the verbs that
write them, the names they are stored under (those of runs started by older versions), and no
other module of the product touches the hash."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import orjson
import redis

from fleetgen.runstate import manifest as mf
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import (
    FINISHED_AT,
    STATE_PRODUCED,
    STATE_STOPPED,
    Manifest,
    RunManifest,
)

ROOT = Path(__file__).resolve().parents[2]
# Every field a manifest has ever held, as stored: a run started by an older fleetgen must
# read the same.
STORED_FIELDS = {"settings", "state", "started_at", "read", "expected", "total", "produced_at",
                 "input_bytes", "stop_reason", "stopped_at", "paused_s", FINISHED_AT}
# The manifest's key, read or written.
KEY_USE = re.compile(r"(?:\bkeys|(?:RunKeys|run_keys)\([^)]*\))\.manifest\b")
# Besides the owner: the worker's outcome script checks that the run still exists (a purged
# run's outcome is dropped), which reads no field.
KEY_USERS = {"fleetgen/runstate/manifest.py", "workers/sink.py"}


def test_a_manifest_written_by_an_older_fleetgen_reads_as_a_type() -> None:
    # As the code before fleetgen/runstate/manifest.py stored it (every value a string in Redis).
    raw = {"settings": orjson.dumps({"tokenizer": "qwen3.6", "n": 2}).decode(),
           "state": "produced", "started_at": "100.5", "read": "8", "expected": "10",
           "total": "8", "produced_at": "120", "input_bytes": "4096", "paused_s": "3.25",
           "finished_at": "150"}
    m = Manifest.parse(raw)
    assert m.exists and m.produced and m.stopped is None
    assert m.pinned == {"tokenizer": "qwen3.6", "n": 2}
    assert (m.started_at, m.read, m.expected, m.total, m.rows) == (100.5, 8, 10, 8, 8)
    assert (m.input_bytes, m.paused_s, m.finished_at) == (4096, 3.25, 150.0)
    reading = Manifest.parse({"state": "producing", "started_at": "1", "read": "3",
                              "expected": "10"})
    assert not reading.produced and reading.rows == 10 and reading.settings is None
    stopped = Manifest.parse({"state": STATE_STOPPED})
    assert stopped.stopped == mf.STOPPED_BY_DEFAULT
    none = Manifest.parse({})
    assert not none.exists and none.rows is None and none.pinned == {}


def test_the_verbs_write_the_fields_runs_have_always_had(rclient: redis.Redis) -> None:
    record = RunManifest(rclient, "r")
    assert not record.exists() and not record.read().exists
    record.start({"tokenizer": "qwen3.6"})
    assert rclient.sismember("fleetgen:runs", "r")
    record.record_read(4)
    m = record.read()
    assert m.state == "producing" and m.read == 4 and m.expected is None and m.total is None
    assert m.pinned == {"tokenizer": "qwen3.6"}
    record.stop("truncated>0.2: 3 of 5")
    assert record.read().stopped == "truncated>0.2: 3 of 5"
    record.pin_finished(200.0)
    record.resume()
    m = record.read()
    assert m.state == "producing" and m.stop_reason is None and m.finished_at is None
    record.close(10, input_bytes=4096)
    record.add_pause(2.5)
    record.add_pause(1.0)
    record.pin_finished(300.0)
    m = record.read()
    assert m.produced and m.total == 10 and m.read == 10 and m.input_bytes == 4096
    assert m.paused_s == 3.5 and m.finished_at == 300.0
    with rclient.pipeline(transaction=True) as pipe:
        record.reopen(pipe)
        pipe.execute()
    assert record.read().finished_at is None
    assert set(record.raw()) <= STORED_FIELDS
    assert set(rclient.hkeys(RunKeys("r").manifest)) <= {f.encode() for f in STORED_FIELDS}


def test_reassert_writes_back_what_redis_forgot(rclient: redis.Redis) -> None:
    record = RunManifest(rclient, "r")
    record.start({"n": 1})
    record.close(5)
    assert not record.reassert({"n": 1}, 5)  # nothing missing
    rclient.hdel(RunKeys("r").manifest, "total")
    assert record.reassert({"n": 1}, 5) and record.read().total == 5
    rclient.delete(RunKeys("r").manifest)
    rclient.srem("fleetgen:runs", "r")
    assert record.reassert({"n": 1}, 5)
    m = record.read()
    assert m.state == STATE_PRODUCED and m.pinned == {"n": 1} and m.expected == 5
    assert rclient.sismember("fleetgen:runs", "r")


def test_no_other_module_touches_the_manifest() -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "fleetgen",
                            "producer", "workers"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    users = {name for name in files if name.endswith(".py") and (ROOT / name).is_file()
             and KEY_USE.search((ROOT / name).read_text())}
    assert users == KEY_USERS
