"""The output directory's one owner (fleetgen/records/outdir.py), on real files: a claim ties a
directory to one run, a torn tail is cut, appended lines are fsynced before `append` returns,
and a replaced file (the failures file, summary.json, an export) is the old one or the new one
whole, also when the process dies between writing the temporary file and renaming it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from fleetgen.errors import ConfigError
from fleetgen.queue.contract import KIND_FAILURE, KIND_REJECTED, KIND_RESULT
from fleetgen.records import outdir
from fleetgen.records.outdir import OutputDir, atomic_file, temp_name

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Every fsync (by the path of the file or directory synced) and rename, in order."""
    seen: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        seen.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def spy_replace(src: str | Path, dst: str | Path) -> None:
        seen.append(("rename", f"{src} -> {dst}"))
        replace(src, dst)

    monkeypatch.setattr(outdir.os, "fsync", spy_fsync)
    monkeypatch.setattr(outdir.os, "replace", spy_replace)
    yield seen


def test_the_names_are_the_public_contract(tmp_path: Path) -> None:
    d = OutputDir(tmp_path)
    assert [p.name for p in d.own_files()] == ["results.jsonl", "failures.jsonl",
                                               "rejected.jsonl", "holdout.jsonl",
                                               ".fleetgen-run", "summary.json"]
    assert d.file(KIND_FAILURE) == tmp_path / "failures.jsonl"


def test_a_claim_ties_the_directory_to_one_run(tmp_path: Path) -> None:
    d = OutputDir(tmp_path / "out")
    assert d.owner() is None
    d.claim("r1")  # creates the directory
    assert (tmp_path / "out" / ".fleetgen-run").read_text() == "r1\n"
    assert d.owner() == "r1"
    d.claim("r1")  # the same run again: a restarted drainer
    with pytest.raises(ConfigError, match="holds the output of run 'r1', not 'r2'"):
        d.claim("r2")
    assert d.owner() == "r1"


def test_output_files_without_a_marker_are_not_claimed(tmp_path: Path) -> None:
    (tmp_path / "rejected.jsonl").write_bytes(b'{"line": 0}\n')
    with pytest.raises(ConfigError, match="unknown run"):
        OutputDir(tmp_path).claim("r1")
    assert not (tmp_path / ".fleetgen-run").exists()


def test_the_marker_is_written_atomically_and_fsynced(tmp_path: Path,
                                                      events: list[tuple[str, str]]) -> None:
    OutputDir(tmp_path).claim("r1")
    tmp = str(temp_name(tmp_path / ".fleetgen-run"))
    assert events == [("fsync", tmp), ("rename", f"{tmp} -> {tmp_path / '.fleetgen-run'}"),
                      ("fsync", str(tmp_path))]


@pytest.mark.parametrize(("content", "cut"), [
    (b'{"line": 0}\n{"line": 1}\n', 0),
    (b'{"line": 0}\n{"line": 1}\n{"li', 4),
    (b'{"li', 4),  # nothing but a torn line
    (b"", 0),
])
def test_repair_cuts_only_a_torn_tail(tmp_path: Path, content: bytes, cut: int) -> None:
    (tmp_path / "results.jsonl").write_bytes(content)
    assert OutputDir(tmp_path).repair(KIND_RESULT) == cut
    assert (tmp_path / "results.jsonl").read_bytes() == content[:len(content) - cut]


def test_repair_finds_the_last_newline_chunks_back(tmp_path: Path,
                                                   events: list[tuple[str, str]]) -> None:
    whole = b'{"line": 0}\n'
    torn = b"x" * (3 * (1 << 16) + 17)  # a torn line longer than three reading chunks
    (tmp_path / "failures.jsonl").write_bytes(whole + torn)
    assert OutputDir(tmp_path).repair(KIND_FAILURE) == len(torn)
    assert (tmp_path / "failures.jsonl").read_bytes() == whole
    assert events == [("fsync", str(tmp_path / "failures.jsonl"))]  # the cut is durable


def test_repair_of_a_missing_file_is_nothing(tmp_path: Path) -> None:
    assert OutputDir(tmp_path).repair(KIND_REJECTED) == 0
    assert not (tmp_path / "rejected.jsonl").exists()


def test_append_writes_whole_lines_and_fsyncs_before_returning(
        tmp_path: Path, events: list[tuple[str, str]]) -> None:
    d = OutputDir(tmp_path)
    d.open_appends()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failures.jsonl", "rejected.jsonl",
                                                          "results.jsonl"]
    d.append(KIND_RESULT, [b'{"line": 0}', b'{"line": 1}'])
    assert events == [("fsync", str(tmp_path / "results.jsonl"))]
    # A second process sees the lines at once: nothing waits in a buffer.
    assert (tmp_path / "results.jsonl").read_bytes() == b'{"line": 0}\n{"line": 1}\n'
    d.append(KIND_RESULT, [b'{"line": 2}'])
    d.close()
    assert (tmp_path / "results.jsonl").read_bytes().count(b"\n") == 3


def test_replace_is_atomic_and_appends_follow_the_new_file(
        tmp_path: Path, events: list[tuple[str, str]]) -> None:
    d = OutputDir(tmp_path)
    d.open_appends()
    d.append(KIND_FAILURE, [b'{"line": 0}', b'{"line": 1}'])
    events.clear()
    d.replace(KIND_FAILURE, [b'{"line": 1}\n'])
    path = tmp_path / "failures.jsonl"
    tmp = str(temp_name(path))
    assert events == [("fsync", tmp), ("rename", f"{tmp} -> {path}"), ("fsync", str(tmp_path))]
    d.append(KIND_FAILURE, [b'{"line": 2}'])  # into the new file, not the old inode
    d.close()
    assert path.read_bytes() == b'{"line": 1}\n{"line": 2}\n'
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_an_exception_inside_an_atomic_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"old\n")
    with pytest.raises(RuntimeError), atomic_file(path) as f:
        f.write(b"new, half")
        raise RuntimeError("the export failed")
    assert path.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.jsonl"]


def test_the_summary_is_written_durably_and_read_back(tmp_path: Path,
                                                      events: list[tuple[str, str]]) -> None:
    d = OutputDir(tmp_path)
    assert d.read_summary() is None
    d.write_summary({"run": "r1", "complete": True})
    assert d.read_summary() == {"run": "r1", "complete": True}
    path = tmp_path / "summary.json"
    assert events[-2:] == [("rename", f"{temp_name(path)} -> {path}"), ("fsync", str(tmp_path))]


CRASH_BEFORE_RENAME = """
import os, sys
from pathlib import Path
from fleetgen.records import outdir
outdir.os.replace = lambda src, dst: os._exit(9)  # the process dies after the temp is fsynced
d = outdir.OutputDir(Path(sys.argv[1]))
if sys.argv[2] == "summary":
    d.write_summary({"run": "r1", "complete": True})
else:
    d.replace(sys.argv[3], [b'{"line": 1}\\n'])
"""


@pytest.mark.parametrize("what", ["summary", "failures"])
def test_a_crash_between_temp_write_and_rename_leaves_the_old_file_whole(
        tmp_path: Path, what: str) -> None:
    d = OutputDir(tmp_path)
    d.claim("r1")
    d.write_summary({"run": "r1", "complete": False})
    (tmp_path / "failures.jsonl").write_bytes(b'{"line": 0}\n{"line": 1}\n')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    argv = [sys.executable, "-c", CRASH_BEFORE_RENAME, str(tmp_path), what, KIND_FAILURE]
    crashed = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             capture_output=True, check=False)
    assert crashed.returncode == 9, crashed.stderr.decode()
    left = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert len(left) == 1  # the crash left its temporary file, written whole
    name = "summary.json" if what == "summary" else "failures.jsonl"
    assert left[0].name.startswith(f".{name}.tmp-")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p not in left} == before
    assert orjson.loads((tmp_path / "summary.json").read_bytes())["complete"] is False
    # The next claim (a restarted drainer) clears the leftover, and only its own kind.
    (tmp_path / ".export.conversations.jsonl.tmp-1").write_bytes(b"an export under way")
    d.claim("r1")
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp-" in p.name) == [
        ".export.conversations.jsonl.tmp-1"]
