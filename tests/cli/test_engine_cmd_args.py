"""`fleetgen run --engine-cmd`'s mistakes are one line, exit 3, before anything starts (no
--out made, no process left): a line without {port}, a program that does not exist, GPUs this
host does not have, --engine-cmd with --engine-url."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen import exitcodes
from tests.support.survivors import marked, new_mark

SIM = f"{sys.executable} -m fleetgen.simulator --port {{port}}"


@pytest.mark.parametrize(("args", "says"), [
    (["--engine-cmd", f"{sys.executable} -m fleetgen.simulator --port 30000"],
     "--engine-cmd must contain {port}, where fleetgen puts each engine's port"),
    (["--engine-cmd", "no-such-server --port {port}"],
     "--engine-cmd: program 'no-such-server' is not on PATH"),
    (["--engine-cmd", SIM, "--gpus", "0,5"],
     "--gpus names GPU 5, which this host does not have (visible: 0,1,2,3)"),
    (["--engine-cmd", SIM, "--gpus", "0-2", "--gpus-per-engine", "2"],
     "--gpus-per-engine 2 does not divide the 3 GPU(s) 0,1,2"),
    (["--engine-cmd", SIM, "--engine-url", "http://127.0.0.1:30000"],
     "--engine-cmd starts the engines, --engine-url names running ones: give one of them"),
    ([], "give the servers (--engine-url URL) or how to start them"),
])
def test_a_mistake_is_one_line_and_nothing_starts(tmp_path: Path, args: list[str],
                                                  says: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    mark = new_mark()
    done = subprocess.run(
        [sys.executable, "-m", "fleetgen", "run", str(prompts), "--out", "out", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, **mark, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert done.returncode == exitcodes.CONFIG, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("fleetgen run: ") and says in line, line
    assert done.stdout == ""
    assert not (tmp_path / "out").exists()
    assert marked(mark) == []
