"""Exporter tests run the real command (`fleetgen export`, through the CLI's main) on output
directories written by hand (tests/support/outdir.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgen.cli.main import main
from tests.support.cli import Export, Ran
from tests.support.outdir import write_output_dir


@pytest.fixture
def export(capsys: pytest.CaptureFixture[str]) -> Export:
    """`fleetgen export ARGS...` in this process: exit code, stdout, stderr."""

    def run(*args: object) -> Ran:
        code = main(["export", *(str(a) for a in args)])
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


@pytest.fixture
def drained(tmp_path: Path) -> Path:
    return write_output_dir(tmp_path / "out")
