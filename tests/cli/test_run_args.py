"""`fleetgen run`'s mistakes are one line before anything starts: a server that does not answer
(exit 4), a port range that is a typo, a --run that is not the one --out holds (exit 3); its
port ranges written out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen import exitcodes
from fleetgen.engine import engine_urls
from fleetgen.errors import ConfigError
from fleetgen.local.ports import lease_port


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    return subprocess.run([sys.executable, "-m", "fleetgen", "run", str(prompts), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in done.stderr, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("fleetgen run:")]


def test_port_ranges_are_written_out() -> None:
    assert engine_urls(["http://10.0.0.2:30000-30002", "http://h:1"]) == [
        "http://10.0.0.2:30000", "http://10.0.0.2:30001", "http://10.0.0.2:30002", "http://h:1"]
    with pytest.raises(ConfigError, match="a range names at most 64"):
        engine_urls(["http://127.0.0.1:30000-33999"])
    with pytest.raises(ConfigError, match="named twice"):
        engine_urls(["http://h:1-2", "http://h:2"])


def test_an_unreachable_server_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with lease_port() as lease:  # a port nobody listens on
        done = run_cli(tmp_path, "--engine-url", f"http://127.0.0.1:{lease.port}",
                       "--out", "out")
    assert done.returncode == exitcodes.UNAVAILABLE, done.stderr
    (line,) = said(done)
    assert f"http://127.0.0.1:{lease.port} unreachable" in line and "fleetgen doctor" in line
    assert "starting run" not in done.stdout
    assert not (tmp_path / "out").exists()  # refused before anything: no empty --out left


def test_a_run_name_other_than_the_one_out_holds_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".fleetgen-run").write_text("first\n")  # the drainer's marker
    done = run_cli(tmp_path, "--engine-url", "http://127.0.0.1:1", "--out", "out",
                   "--run", "second")
    assert done.returncode == exitcodes.CONFIG
    assert said(done) == ["fleetgen run: out holds the output of run 'first', not 'second'; "
                          "drop --run to resume it, or pick another --out"]


def test_measure_acceptance_with_holdout_is_refused(tmp_path: Path) -> None:
    """On holdout.jsonl with --holdout still on, the rows were held out again, never sent, and
    the run exited 0: refused in one line, before anything starts."""
    done = run_cli(tmp_path, "--engine-url", "http://127.0.0.1:1", "--out", "out",
                   "--measure-acceptance", "--holdout", "0.2")
    assert done.returncode == exitcodes.CONFIG
    (line,) = said(done)
    assert "--measure-acceptance" in line and "drop --holdout 0.2" in line
    assert not (tmp_path / "out").exists()


def test_estimate_help_offers_only_what_it_takes() -> None:
    """`estimate --help` listed --turns, --holdout and --max-output-tokens, which it refuses;
    --sample counts rows (prompts), each of them --n requests."""
    done = subprocess.run([sys.executable, "-m", "fleetgen", "estimate", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    offered = {line.split()[0] for line in done.stdout.splitlines()
               if line.startswith("  -")} | set(done.stdout.split("\n\n")[0].split())
    for refused in ("--turns", "--holdout", "--max-output-tokens"):
        assert refused not in offered and f"[{refused}" not in done.stdout, refused
    assert "rows (prompts) to sample: each is --n requests" in " ".join(done.stdout.split())
