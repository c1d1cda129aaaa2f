"""The tests' own import rule: what tests share lives in tests/support; no module under tests/
imports a test module (test_*.py) or a conftest (pytest loads those itself, and a test that
imports another runs the other's module code twice, under two names)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.tiers import FLEET_FOLDERS

TESTS = Path(__file__).resolve().parents[1]


def imported(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`, `from a import b` as a.b too (b may
    be a module), at any depth (an import inside a function counts)."""
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append((node.lineno, node.module))
            names += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return names


def forbidden(name: str) -> bool:
    """A test module or a conftest of this suite."""
    parts = name.split(".")
    return parts[0] == "tests" and any(p == "conftest" or p.startswith("test_")
                                       for p in parts[1:])


def violations(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for line, name in imported(path.read_text(encoding="utf-8")):
            if forbidden(name):
                found.append(f"{path.relative_to(root.parent)}:{line} imports {name}")
    return found


def test_no_test_imports_a_test_module_or_a_conftest() -> None:
    found = violations(TESTS)
    assert not found, "move what is shared to tests/support:\n" + "\n".join(found)


@pytest.mark.parametrize(("line", "wrong"), [
    ("from tests.chaos.test_redis_loss import copy_data\n", True),
    ("from tests.e2e.conftest import started_fleet\n", True),
    ("from tests.conftest import require_binary\n", True),
    ("import tests.exporter.test_parquet\n", True),
    ("from tests.e2e import test_formats\n", True),
    ("def later():\n    from tests.chaos import conftest\n", True),
    ("from tests.support.pipeline import make_prompts\n", False),
    ("from tests.support import held\n", False),
    ("from tests.layout import layers\n", False),
    ("from fleetgen.cli.main import main\n", False),
])
def test_each_kind_of_wrong_import_is_caught(tmp_path: Path, line: str, wrong: bool) -> None:
    root = tmp_path / "tests"
    (root / "e2e").mkdir(parents=True)
    (root / "e2e" / "test_x.py").write_text(line, encoding="utf-8")
    found = violations(root)
    assert bool(found) == wrong, found
    assert all(f.startswith("tests/e2e/test_x.py:") for f in found)


# What starts the product's processes in a test module (a local fleet, Celery workers).
STARTS_PROCESSES = re.compile(
    r"LocalFleet\(|sim_fleet\(|make_fleet|start_worker\(|celery_worker_argv\(")


def test_a_module_that_starts_workers_is_in_the_fleet_tier() -> None:
    """The tier is decided by a module's needs (tests/conftest.py): outside the fleet folders,
    a module that starts a fleet or Celery workers says so with its own `pytestmark`, so
    `make check` (not fleet) never starts one, and a module that needs only Valkey or nothing
    is not held out of it by its folder."""
    tests = Path(__file__).resolve().parents[1]
    unmarked = [str(path.relative_to(tests)) for path in sorted(tests.glob("*/test_*.py"))
                if path.parent.name not in FLEET_FOLDERS
                and STARTS_PROCESSES.search(path.read_text())
                and "pytestmark = pytest.mark.fleet" not in path.read_text()]
    assert not unmarked, f"start processes but are not marked fleet: {unmarked}"
