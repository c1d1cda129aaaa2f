"""The import rule holds for the product, and it catches each kind of wrong import."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.layout import layers

ROOT = Path(__file__).resolve().parents[2]


def test_the_product_keeps_its_floors() -> None:
    violations = layers.check(ROOT)
    assert not violations, "\n".join(map(str, violations))


def test_every_product_module_has_a_room() -> None:
    homeless = [m for m in layers.product_modules(ROOT) if layers.room(m) is None]
    assert not homeless


@pytest.mark.parametrize(("module", "line", "why"), [
    # the base reaching up to a role, inside a function (where a cycle hides)
    ("fleetgen/base/runstate.py", "def _late():\n    from producer.pipeline import Producer\n",
     "above floor 1"),
    # producer <-> workers
    ("producer/budget.py", "from workers.sink import StreamSink\n", "same floor"),
    # the engine package importing the CLI, under TYPE_CHECKING
    ("fleetgen/engine/http.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fleetgen.cli import main\n",
     "above floor 2"),
    # the simulator importing product code, relatively spelled from the base
    ("fleetgen/simulator/model.py", "from fleetgen.base import contract\n", "no product code"),
    # a relative import that climbs to a higher floor
    ("fleetgen/base/outcomes.py", "from ..monitor import status\n", "above floor 1"),
    # the product importing a test helper
    ("fleetgen/drainer/loop.py", "import tests.conftest\n", "stand above the product"),
])
def test_a_wrong_import_is_caught(tmp_path: Path, module: str, line: str, why: str) -> None:
    for top in layers.PRODUCT:
        shutil.copytree(ROOT / top, tmp_path / top,
                        ignore=shutil.ignore_patterns("__pycache__", "data"))
    target = tmp_path / module
    target.write_text(target.read_text() + "\n" + line)
    violations = layers.check(tmp_path)
    assert len(violations) == 1, violations
    assert violations[0].module == module.removesuffix(".py").replace("/", ".")
    assert why in violations[0].why
