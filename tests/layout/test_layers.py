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
    # the run state reaching up to a role, inside a function (where a cycle hides)
    ("fleetgen/runstate/lifecycle.py", "def _late():\n    from producer.loop import Producer\n",
     "above floor 3"),
    # the queue's wire reaching up to the run state
    ("fleetgen/queue/wire.py", "from fleetgen.runstate.keys import RunKeys\n", "above floor 2"),
    # the settings reaching up to the queue's Redis
    ("fleetgen/settings/envvars.py", "from fleetgen.queue import redisconn\n", "above floor 1"),
    # the root's error hierarchy reaching up to the settings
    ("fleetgen/errors.py", "from fleetgen.settings import envvars\n", "above floor 0"),
    # the run state and the records, side by side
    ("fleetgen/records/outdir.py", "from fleetgen.runstate import manifest\n", "same floor"),
    # producer <-> workers
    ("producer/budget.py", "from workers.sink import StreamSink\n", "same floor"),
    # the engine package importing the CLI, under TYPE_CHECKING
    ("fleetgen/engine/http.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fleetgen.cli import main\n",
     "above floor 4"),
    # the simulator importing product code
    ("fleetgen/simulator/model.py", "from fleetgen.queue import contract\n", "no product code"),
    # a relative import that climbs to a higher floor
    ("fleetgen/records/outcomes.py", "from ..monitor import status\n", "above floor 3"),
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


def import_cycles(root: Path) -> list[list[str]]:
    """Every set of product modules that import one another back (Tarjan's strongly
    connected components; TYPE_CHECKING and in-function imports count, as for the floors)."""
    modules = layers.product_modules(root)
    known = set(modules)
    graph = {m: sorted({i for _, i in layers.imports_of(m, p, known) if i in known and i != m})
             for m, p in modules.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in order:
            visit(module)
    return found


def test_no_modules_import_each_other_back() -> None:
    """Issue 49: the simulator's server, routes and admin did (under TYPE_CHECKING)."""
    assert import_cycles(ROOT) == []


def test_a_cycle_is_caught(tmp_path: Path) -> None:
    for top in layers.PRODUCT:
        shutil.copytree(ROOT / top, tmp_path / top,
                        ignore=shutil.ignore_patterns("__pycache__", "data"))
    routes = tmp_path / "fleetgen/simulator/routes.py"
    routes.write_text(routes.read_text() + "\nif TYPE_CHECKING:\n"
                      "    from fleetgen.simulator.server import SimServer\n")
    assert import_cycles(tmp_path) == [["fleetgen.simulator.routes", "fleetgen.simulator.server"]]
