"""The wheel that `pip install .` (and the Dockerfile) installs holds every product module:
packages are discovered, so a new subpackage cannot be left out while editable installs pass."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.layout import layers

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_every_product_module_and_the_sample_data(tmp_path: Path) -> None:
    # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for top in layers.PRODUCT:
        shutil.copytree(ROOT / top, source / top, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(source)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("fleetgen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {str(path.relative_to(ROOT)) for path in layers.product_modules(ROOT).values()}
    assert expected, "no product modules found"
    missing = sorted(expected - names)
    assert not missing, f"not in the wheel: {missing}"
    assert "fleetgen/data/sample_prompts.jsonl" in names
    # The report's and the live page's script, styles and vendored chart library (package data).
    web = {f"fleetgen/monitor/web/{name}" for name in (
        "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "page.js", "page.css", "live.js")}
    assert web <= names, sorted(web - names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "fleetgen.cli.main:entrypoint" in zipfile.ZipFile(wheel).read(entry_points).decode()
