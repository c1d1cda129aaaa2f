"""Fixtures of the bench smoke tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def figures_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The tracked figures of a real `make bench` run stay untouched.
    out = tmp_path / "figures"
    monkeypatch.setattr("bench.common.FIGURES_DIR", out)
    return out
