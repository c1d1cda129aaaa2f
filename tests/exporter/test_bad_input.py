"""What `fleetgen export` does with a directory it cannot fully trust: one line and exit 3 for
what is not a drained output, exit 2 for a bad flag, and for a torn last line (a drainer
killed or still writing) an export without it and exit 1; never a half-written output file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from tests.support.cli import Export
from tests.support.outdir import read_jsonl, write_output_dir


def no_temp_files(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if ".tmp-" in p.name]


def test_not_an_output_directory(export: Export, tmp_path: Path) -> None:
    missing = export(tmp_path / "nope", "--format", "conversations")
    assert missing.code == 3
    assert missing.err == (f"fleetgen export: no such directory: {tmp_path / 'nope'}; pass the "
                           "directory given to `fleetgen drain --out`\n")
    (tmp_path / "file.jsonl").write_text("{}\n")
    assert export(tmp_path / "file.jsonl", "--format", "parquet").err.startswith(
        f"fleetgen export: {tmp_path / 'file.jsonl'} is a file, not an output directory")
    # Results without the drainer's marker: some other tool's directory.
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "results.jsonl").write_text('{"id": "x", "line": 1}\n')
    ran = export(stray, "--format", "openai-batch")
    assert ran.code == 3
    assert "is not a drained output directory (no .fleetgen-run marker" in ran.err
    assert ran.err.count("\n") == 1 and "Traceback" not in ran.err
    # The marker alone: the drainer has not written anything yet.
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / ".fleetgen-run").write_text("r\n")
    ran = export(tmp_path / "fresh", "--format", "conversations")
    assert ran.code == 3 and "has no results.jsonl" in ran.err
    assert not (tmp_path / "fresh" / "export.conversations.jsonl").exists()


def test_unknown_format_is_a_usage_error(drained: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "fleetgen", "export", str(drained),
                           "--format", "csv"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "invalid choice: 'csv'" in done.stderr and "conversations" in done.stderr
    assert sorted(p.name for p in drained.iterdir() if p.name.startswith("export")) == []


def test_a_torn_last_line_is_left_out_and_the_run_counts_as_incomplete(
        export: Export, drained: Path) -> None:
    """The drainer fsyncs whole lines before it acks, so a torn tail was never acknowledged:
    it is still in Redis, and the next `fleetgen drain` cuts it and writes it again. It is
    not a record yet; the export leaves it out, says so, and exits 1."""
    results = drained / "results.jsonl"
    whole = read_jsonl(results)
    with results.open("ab") as f:
        f.write(b'{"messages": [{"role": "user", "content": "half')
    ran = export(drained, "--format", "conversations")
    assert ran.code == 1
    assert "results.jsonl ends in a torn line (47 bytes)" in ran.err
    assert "is not complete (a file ends in a torn line)" in ran.err
    assert len(read_jsonl(drained / "export.conversations.jsonl")) == len(whole) - 1 == 10
    assert no_temp_files(drained)


def test_a_damaged_line_inside_a_file_is_refused(export: Export, drained: Path) -> None:
    failures = drained / "failures.jsonl"
    lines = failures.read_bytes().splitlines(keepends=True)
    failures.write_bytes(lines[0] + b'{"id": "x", "li\n' + b"".join(lines[1:]))
    ran = export(drained, "--format", "openai-batch")
    assert ran.code == 3
    assert ran.err.startswith("fleetgen export: failures.jsonl: line 2 is not valid JSON")
    assert ran.err.count("\n") == 1
    assert not (drained / "export.openai-batch.jsonl").exists()
    assert no_temp_files(drained)
    # The other formats read results only, and still work.
    assert export(drained, "--format", "conversations").code == 0


def test_an_incomplete_run_is_exported_with_exit_1(export: Export, tmp_path: Path) -> None:
    out = write_output_dir(tmp_path / "out", complete=False)
    ran = export(out, "--format", "openai-batch")
    assert ran.code == 1
    assert "run 'exp-fixture' is not complete (summary.json says so)" in ran.err
    assert len(read_jsonl(out / "export.openai-batch.jsonl")) == 14
    (out / "summary.json").unlink()  # a drainer killed with SIGKILL writes none
    ran = export(out, "--format", "openai-batch")
    assert ran.code == 1 and "(it has no summary.json)" in ran.err


def test_out_may_not_be_a_drainer_file_and_a_failed_export_keeps_the_old_one(
        export: Export, drained: Path) -> None:
    before = (drained / "results.jsonl").read_bytes()
    ran = export(drained, "--format", "conversations", "--out", drained / "results.jsonl")
    assert ran.code == 3 and "is one of the drainer's own files" in ran.err
    assert (drained / "results.jsonl").read_bytes() == before
    # An export that fails half-way leaves the previous export as it was.
    assert export(drained, "--format", "openai-batch").code == 0
    previous = (drained / "export.openai-batch.jsonl").read_bytes()
    with (drained / "rejected.jsonl").open("ab") as f:
        f.write(b"not json\n")
    assert export(drained, "--format", "openai-batch").code == 3
    assert (drained / "export.openai-batch.jsonl").read_bytes() == previous
    assert no_temp_files(drained)


def test_redis_is_never_needed(drained: Path) -> None:
    """A purged run exports: the command runs with Redis unreachable."""
    env = dict(os.environ, FLEETGEN_REDIS_URL="redis://127.0.0.1:1/0")
    done = subprocess.run([sys.executable, "-m", "fleetgen", "export", str(drained),
                           "--format", "parquet"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert (drained / "export.parquet").exists()
    assert orjson.loads((drained / "summary.json").read_bytes())["complete"] is True
