"""`fleetgen run` says no more than is true, as a user runs it (servers started on their own with
`fleetgen sim`, the defaults, a relative --out): a gzip file named .jsonl is read, not rejected;
a finished run refuses a changed pinned option and keeps its summary; a full disk is one line
and exit 5, and the same command resumes once there is room; a run with failures exits 1 and
its last line is the command that sends them again, which moves each success to results."""

from __future__ import annotations

import gzip
import os
import shlex
import subprocess
from pathlib import Path

import orjson
import pytest

from fleetgen import exitcodes
from fleetgen.local.ports import lease_port
from tests.support.cli import fleetgen_cli
from tests.support.disk import small_disk
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.simproc import sim_process
from tests.support.sims import engine_flags

OUT = "out/run"  # relative, as a user types it: every run below starts in its own directory


def fleetgen_run(cwd: Path, prompts: Path, urls: list[str], *extra: str,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = fleetgen_cli("run", str(prompts), *engine_flags(urls),
                        "--out", OUT, *extra)
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The command's own lines on stderr (its one-line errors), without the log's."""
    return [line for line in done.stderr.splitlines() if line.startswith("fleetgen run:")]


def test_a_gzip_named_jsonl_is_read_and_a_finished_run_refuses_a_changed_setting(
        tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    kinds = make_prompts(plain, 30)
    prompts = tmp_path / "prompts.jsonl"  # gzip inside, .jsonl outside
    prompts.write_bytes(gzip.compress(plain.read_bytes()))
    out = tmp_path / OUT
    with sim_process(tmp_path / "sim.log", count=2) as urls:
        first = fleetgen_run(tmp_path, prompts, urls)
        assert first.returncode == exitcodes.OK, first.stdout[-3000:] + first.stderr[-3000:]
        data = assert_exactly_once(out, set(kinds["good"]))
        assert len(data["results"]) == 30 and not data["rejected"], data["rejected"][:2]
        summary, results = (out / "summary.json").read_bytes(), (out / "results.jsonl").read_bytes()
        assert orjson.loads(summary)["settings"]["max_output_tokens"] is None

        again = fleetgen_run(tmp_path, prompts, urls, "--max-output-tokens", "50")
    assert again.returncode == exitcodes.CONFIG, again.stdout[-3000:] + again.stderr[-3000:]
    lines = said(again)
    assert len(lines) == 1 and "--max-output-tokens unset (the default), now 50" in lines[0], \
        again.stderr[-3000:]
    assert "Traceback" not in again.stderr
    assert "watch it from another shell" not in again.stdout  # refused before any worker
    # The files and their summary as the first run wrote them: nothing describes rows that
    # these settings did not make.
    assert (out / "summary.json").read_bytes() == summary
    assert (out / "results.jsonl").read_bytes() == results
    print(f"\nfleetgen run on a gzip file named .jsonl: 30 of 30 rows written; then {lines[0]}")


def test_a_full_disk_is_one_line_and_the_same_command_resumes_once_there_is_room(
        tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 200)
    with small_disk(tmp_path / "disk", "1m") as disk, \
            sim_process(tmp_path / "sim.log", count=2) as urls:
        full = fleetgen_run(disk.path, prompts, urls)
        assert full.returncode == exitcodes.DISK_FULL, full.stdout[-3000:] + full.stderr[-3000:]
        lines = said(full)
        assert len(lines) == 1, full.stderr[-3000:]
        assert "Traceback" not in full.stderr
        assert str(Path(OUT)) in lines[0] and "run the same command" in lines[0], lines
        out = disk.path / OUT
        partial = assert_whole_lines(out)
        assert partial < 200, "the run ended before the disk was full: the test proves nothing"
        disk.grow("64m")
        again = fleetgen_run(disk.path, prompts, urls)
        assert again.returncode == exitcodes.OK, again.stdout[-3000:] + again.stderr[-3000:]
        data = assert_exactly_once(out, set(kinds["good"]))
        assert len(data["results"]) == 200
    print(f"\nfleetgen run on a 1 MiB disk: {lines[0]}; {partial} rows were written, the same "
          f"command wrote the rest once there was room")


def test_a_full_disk_under_the_files_alone_stops_the_drainer_and_the_same_command_resumes(
        tmp_path: Path) -> None:
    """The fault on the output files, not on Valkey: the run's Valkey state has a disk of its
    own (a second tmpfs mounted at out/run/.fleetgen-state), so the drainer is the one that
    meets ENOSPC, after it has written some rows, and the resume writes the rest once."""
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 200)
    with small_disk(tmp_path / "disk", "96k") as disk, \
            small_disk(tmp_path / "disk" / OUT / ".fleetgen-state", "64m"), \
            sim_process(tmp_path / "sim.log", count=2) as urls:
        full = fleetgen_run(disk.path, prompts, urls)
        assert full.returncode == exitcodes.DISK_FULL, full.stdout[-3000:] + full.stderr[-3000:]
        lines = said(full)
        assert len(lines) == 1 and "Traceback" not in full.stderr, full.stderr[-3000:]
        assert "results.jsonl" in lines[0] and "Valkey" not in lines[0], lines
        out = disk.path / OUT
        partial = assert_whole_lines(out)
        # The fault landed on the drainer mid-run: some rows were written, not all.
        assert 0 < partial < 200, partial
        disk.grow("64m")
        again = fleetgen_run(disk.path, prompts, urls)
        assert again.returncode == exitcodes.OK, again.stdout[-3000:] + again.stderr[-3000:]
        data = assert_exactly_once(out, set(kinds["good"]))
        assert len(data["results"]) == 200
    print(f"\nfleetgen run, its files on a 96 KiB disk: {lines[0]}; {partial} rows were written "
          f"before it, the same command wrote the rest once there was room")


def assert_whole_lines(out: Path) -> int:
    """Lines in the output files (each whole: a torn one fails here)."""
    total = 0
    for name in ("results.jsonl", "failures.jsonl", "rejected.jsonl"):
        path = out / name
        raw = path.read_bytes() if path.exists() else b""
        assert raw == b"" or raw.endswith(b"\n"), f"{path} ends with a torn line"
        total += len([orjson.loads(line) for line in raw.splitlines()])
    return total


# The simulator's faults are a seeded stream per server: with seed 86 its first 12 draws are
# clean (the pre-flight's 6 requests pass, as they must for the run to start) and about a
# third of the rest fail.
FAULTY = ("--error-rate", "0.3", "--seed", "86")


def test_failures_exit_1_and_the_command_it_prints_sends_them_again(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 40)
    out = tmp_path / OUT
    # One attempt a request: a failure at once, not after five (the env of the user's shell).
    env = {"FLEETGEN_MAX_ATTEMPTS": "1"}
    lease = lease_port()  # the server keeps its URL when it is started again, fixed
    try:
        with sim_process(tmp_path / "sim1.log", *FAULTY, port=lease.port) as urls:
            first = fleetgen_run(tmp_path, prompts, urls, env=env)
        assert first.returncode == exitcodes.INCOMPLETE, first.stdout[-3000:] + \
            first.stderr[-3000:]
        data = assert_exactly_once(out, set(kinds["good"]))
        failed = len(data["failures"])
        assert 0 < failed < 40, "the faults did not land: the test proves nothing"
        last = first.stdout.rstrip().splitlines()[-1]
        assert last.startswith(f"fleetgen run: complete with {failed} failed row(s)"), last
        command = shlex.split(last.split("send them again with: ", 1)[1])
        assert command[0] == "fleetgen" and command[-1] == "--retry-failures", command
        assert not (out / ".fleetgen-state").exists()  # complete: the run's Redis is gone
        before = orjson.loads((out / "summary.json").read_bytes())

        with sim_process(tmp_path / "sim2.log", port=lease.port):
            again = subprocess.run(fleetgen_cli(*command[1:]), cwd=tmp_path,
                                   capture_output=True, text=True, timeout=300,
                                   env={**os.environ, **env})
    finally:
        lease.close()
    assert again.returncode == exitcodes.OK, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"sending {failed} failed row(s)" in again.stdout
    data = assert_exactly_once(out, set(kinds["good"]))
    assert len(data["results"]) == 40 and not data["failures"]
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert (summary["total"], summary["done"], summary["failed"]) == (40, 40, 0)
    # Its clock is the run's, not the retry's alone: 40 rows were not made in the retry's time.
    assert summary["started_at"] == pytest.approx(before["started_at"])
    assert summary["wall_s"] > before["wall_s"]
    print(f"\nfleetgen run: {failed} of 40 rows failed, exit 1, last line: {last}; the "
          f"command as printed wrote them all, each once")
