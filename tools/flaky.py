"""Find flaky tests: run the whole suite N times and report every test that failed at least once.

    python tools/flaky.py [-n N] [--out DIR] [-- extra pytest args]      (make flaky N=3)

Each run writes its own JUnit XML (DIR/run-K.xml) and runs without pytest's cache, so no run
reorders or deselects tests because of an earlier one. Exit status: 0 if every test passed in
every run, 1 if any failed or errored at least once, 2 for a usage error. Each run's wall time
is printed with the report (docs/testing.md keeps three of them per tier).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flaky", description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=3, metavar="N",
                        help="how many times to run the suite (3)")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "flaky", metavar="DIR",
                        help="where the JUnit XML of each run goes (out/flaky)")
    parser.add_argument("pytest_args", nargs="*", metavar="PYTEST_ARG",
                        help="passed to pytest after `--` (default: tests)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"-n must be at least 1, got {args.runs}")
    return args


def run_suite(run: int, out: Path, pytest_args: list[str]) -> Path:
    """One whole-suite run; its exit code is not needed, the XML says what failed."""
    xml = out / f"run-{run}.xml"
    xml.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            f"--junitxml={xml}", *(pytest_args or ["tests"])]
    print(f"flaky: run {run}: {' '.join(argv[1:])}", flush=True)
    subprocess.run(argv, cwd=REPO, check=False)
    return xml


def failed_tests(xml: Path) -> list[str]:
    """Test ids that failed or errored in one run; a run that wrote no XML (pytest crashed or
    was killed) counts as one failure of the whole suite, never as a clean run."""
    if not xml.exists():
        return ["<the whole run: no JUnit XML was written>"]
    failed = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return failed


def report(counts: Counter[str], runs: int, seconds: list[float] | None = None) -> str:
    timing = ("\nflaky: wall time of each run: " + ", ".join(_min_s(s) for s in seconds)
              if seconds else "")
    if not counts:
        return f"flaky: no test failed in {runs} run(s){timing}"
    lines = [f"flaky: {len(counts)} test(s) failed at least once in {runs} run(s):"]
    for test, failures in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"  {failures}/{runs}  {test}")
    return "\n".join(lines) + timing


def _min_s(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    counts: Counter[str] = Counter()
    seconds: list[float] = []
    for run in range(1, args.runs + 1):
        started = time.monotonic()
        xml = run_suite(run, args.out, args.pytest_args)
        seconds.append(time.monotonic() - started)
        # A test is counted once per run even if it has several failing phases.
        counts.update(set(failed_tests(xml)))
    print(report(counts, args.runs, seconds))
    return 1 if counts else 0


if __name__ == "__main__":
    sys.exit(main())
