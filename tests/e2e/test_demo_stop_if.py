"""`--stop-if` in the demo (issue 22, point 4): the recipe of docs/reference.md stops the bundled
set before it is all sent, the reason is in summary.json and the final table, the export says the
run was stopped (not "wait for the drain"), and the same command plus --ignore-stop finishes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from fleetgen.cli.demo import sample_prompts

# The recipe of docs/reference.md ("Early warning", "In the demo"): a deliberately wrong budget.
RECIPE = ("--max-output-tokens", "16", "--stop-if", "truncated>0.5", "--after", "40")


def fleetgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=300)


def test_the_readme_recipe_stops_the_bundled_set_early(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rows = sample_prompts().read_bytes().count(b"\n")
    first = fleetgen("demo", "--out", str(out), *RECIPE)
    assert first.returncode == 1, first.stderr[-3000:]
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["complete"] is False
    assert summary["stopped"] and "truncated" in summary["stopped"]
    sent = summary["done"] + summary["failed"] + summary["rejected"]
    print(f"\nstopped with {sent} of {rows} rows sent: {summary['stopped']}")
    assert 40 <= sent < rows, f"{sent} of {rows} sent: the rule did not stop the run early"
    table = {line.split("  ")[1].strip(): line for line in first.stdout.splitlines()
             if line.startswith("  ")}
    assert summary["stopped"] in table["stopped early"]
    assert "--ignore-stop" in first.stdout

    exported = fleetgen("export", str(out), "--format", "conversations")
    assert exported.returncode == 1
    assert "was stopped early" in exported.stderr and "--ignore-stop" in exported.stderr
    assert "when `fleetgen drain` has finished" not in exported.stderr

    going_on = fleetgen("demo", "--out", str(out), *RECIPE, "--ignore-stop")
    assert going_on.returncode == 0, going_on.stderr[-3000:]
    done = orjson.loads((out / "summary.json").read_bytes())
    assert done["run"] == summary["run"] and done["complete"] and done["total"] == rows
    assert not list(out.glob("export.*")), "the stopped run's export was left beside new results"
