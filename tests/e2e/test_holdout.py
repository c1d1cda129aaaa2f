"""`fleetgen run --holdout` as a user runs it: a share of the rows never sent, written as they
were to holdout.jsonl; interrupted mid-read and resumed, the rows held out before the stop still
held out, each once, none answered; a resume with another fraction refused; and holdout.jsonl
itself an input `fleetgen run` takes."""

from __future__ import annotations

import math
import signal
import subprocess
from pathlib import Path

import orjson

from fleetgen import exitcodes
from fleetgen.local.simgpus import SimGpus
from tests.support.cli import fleetgen_cli
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.sims import engine_flags, sims_fixture
from tests.support.waiting import wait_until

# Answers of ~150 tokens at 1 ms a token on 2 x 8 slots: 600 rows take ~6 s, long enough to
# interrupt the run halfway.
SIMS = SimGpus(gpus=2, context_length=4096, max_running_requests=8, ttft_ms=5.0,
               tpot_ms=1.0, output_tokens_mean=150)
ROWS = 600
FRACTION = 0.2


urls = sims_fixture(SIMS)


def run_argv(prompts: str, urls: list[str], out: str, *extra: str) -> list[str]:
    return fleetgen_cli("run", prompts, *engine_flags(urls),
                        "--out", out, *extra)


def lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def test_held_out_rows_are_never_sent_and_stay_the_same_through_a_resume(
        urls: list[str], tmp_path: Path) -> None:
    rows = {f"p{i}": row for i, row in enumerate(make_rows(tmp_path / "p.jsonl"))}
    # A low mark: the interrupt lands while the producer is still reading, so the resume
    # decides the split of the rows it had not read.
    argv = run_argv("p.jsonl", urls, "out/run", "--holdout", str(FRACTION), "--high-water",
                    "32", "--batch-size", "16")
    out = tmp_path / "out" / "run"
    with (tmp_path / "run1.log").open("wb") as log:
        first = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    wait_until(lambda: len(lines(out / "results.jsonl")) >= 60 or first.poll() is not None,
               120, "the first rows written")
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=10) == exitcodes.INTERRUPTED, (tmp_path / "run1.log").read_text()
    answered_before = {r["id"] for r in lines(out / "results.jsonl")}
    held_before = {r["id"] for r in lines(out / "holdout.jsonl")}
    assert len(answered_before) < ROWS * (1 - FRACTION), "ended before the interrupt"

    changed = subprocess.run(run_argv("p.jsonl", urls, "out/run", "--holdout", "0.3"),
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert changed.returncode == exitcodes.CONFIG, changed.stdout + changed.stderr
    assert "--holdout 0.2, now 0.3" in changed.stderr, changed.stderr

    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    data = assert_exactly_once(out, set(rows))  # every row in exactly one file, once
    held = {r["id"] for r in data["holdout"]}
    assert held_before < held and not held & answered_before
    assert not held & {r["id"] for r in data["results"]}
    sigma = math.sqrt(ROWS * FRACTION * (1 - FRACTION))
    assert abs(len(held) - FRACTION * ROWS) <= 3 * sigma, len(held)
    for line in data["holdout"]:  # the input row as it was, and its number in the run
        row_id = line.pop("id")
        assert line.pop("line") == int(str(row_id)[1:]) + 1
        assert {"id": row_id, **line} == rows[str(row_id)]
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["holdout"] == len(held) and summary["complete"] is True
    assert summary["done"] + summary["holdout"] == summary["total"] == ROWS
    assert summary["settings"]["holdout"] == FRACTION

    # holdout.jsonl is an input as it is (the drafter's measurement runs on it). The split in
    # another process with another hash seed: tests/producer/test_holdout.py.
    measured = subprocess.run(run_argv("out/run/holdout.jsonl", urls, "out/measure"),
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert measured.returncode == 0, measured.stdout[-3000:] + measured.stderr[-3000:]
    assert {r["id"] for r in lines(tmp_path / "out/measure/results.jsonl")} == held
    print(f"\n--holdout {FRACTION}: {len(held)} of {ROWS} rows held out "
          f"({len(held_before)} before the Ctrl-C), none sent, each once")


def make_rows(path: Path) -> list[dict[str, object]]:
    make_prompts(path, ROWS)
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]
