"""tools/flaky.py: a test that fails in some runs only is reported with its count, and the
exit status says so."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tools import flaky

# Fails on every other run: the runs share a counter file next to the test.
FLIP = '''
from pathlib import Path

def test_flips():
    counter = Path(__file__).with_suffix(".count")
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    assert n % 2 == 1

def test_steady():
    pass
'''


def test_flaky_reports_a_test_that_failed_in_some_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_flip.py").write_text(FLIP)
    code = flaky.main(["-n", "3", "--out", str(tmp_path / "xml"), "--", str(suite),
                       "--rootdir", str(suite), "-o", "addopts="])
    assert code == 1
    assert sorted(p.name for p in (tmp_path / "xml").iterdir()) == \
        ["run-1.xml", "run-2.xml", "run-3.xml"]
    failed = [flaky.failed_tests(tmp_path / "xml" / f"run-{k}.xml") for k in (1, 2, 3)]
    assert [len(f) for f in failed] == [1, 0, 1]
    assert failed[0][0].endswith("::test_flips")
    printed = capsys.readouterr().out  # ours only: pytest's own output bypasses capsys
    assert "1 test(s) failed at least once in 3 run(s)" in printed
    assert "2/3" in printed and "test_flips" in printed and "test_steady" not in printed
    assert re.search(r"wall time of each run: \d+ min \d+ s, \d+ min \d+ s, \d+ min \d+ s$",
                     printed.strip()), printed


def test_flaky_passes_when_nothing_failed_and_a_missing_report_counts_as_failed(
        tmp_path: Path) -> None:
    assert flaky.report(Counter(), 3) == "flaky: no test failed in 3 run(s)"
    assert flaky.failed_tests(tmp_path / "never-written.xml") == [
        "<the whole run: no JUnit XML was written>"]
