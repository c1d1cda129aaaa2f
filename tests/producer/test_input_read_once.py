"""A fresh `fleetgen produce` opens its input file once (issue 43): the pass that enqueues is
the only one that reads it (no count beforehand, no separate look at its first bytes), so a
10-million-line input costs one read before and while its rows are sent. Counted as the
kernel sees it: the real CLI under strace, every open of the input's path."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.binaries import require_binary
from tests.support.strace import opens_of

ROWS = 30


def write_prompts(tmp_path: Path, kind: str) -> Path:
    lines = "".join(f'{{"id": "r{i}", "prompt": "question {i}"}}\n' for i in range(ROWS))
    if kind == "gzip":  # its compression is told by its first bytes: read from the one open
        prompts = tmp_path / "p.jsonl.gz"
        prompts.write_bytes(gzip.compress(lines.encode()))
    elif kind == "parquet":  # its columns are checked before the run opens: the same handle
        prompts = tmp_path / "p.parquet"
        pq.write_table(pa.table({"id": [f"r{i}" for i in range(ROWS)],
                                 "prompt": [f"question {i}" for i in range(ROWS)]}), prompts)
    else:
        prompts = tmp_path / "p.jsonl"
        prompts.write_text(lines)
    return prompts


@pytest.mark.parametrize("kind", ["jsonl", "gzip", "parquet"])
def test_a_fresh_produce_opens_its_input_once(tmp_path: Path, redis_url: str,
                                               kind: str) -> None:
    strace = require_binary("strace", "/usr/bin/strace",
                            "to count the opens of the input by the real CLI")
    prompts = write_prompts(tmp_path, kind)
    log = tmp_path / "strace.log"
    # --no-wait: no workers here; the pass that reads and enqueues is what is counted.
    # --context-length: no server to read it from.
    done = subprocess.run(
        [strace, "-f", "-qq", "-e", "trace=open,openat", "-o", str(log), sys.executable,
         "-m", "fleetgen", "produce", str(prompts), "--run", "once", "--redis", redis_url,
         "--context-length", "4096", "--no-wait"],
        capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert f"{ROWS} rows read, {ROWS} enqueued" in done.stdout, done.stdout
    assert opens_of(log.read_text(), prompts) == 1
