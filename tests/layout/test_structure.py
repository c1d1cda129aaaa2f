"""The product stays small enough to take in (issue 43): no class over 200 lines, no function
over six parameters, no class name defined twice, one `*options*.py` module. Read with `ast`
from the product's own files (fleetgen/, producer/, workers/), tests and benchmarks aside.
Each check is also run on a made-up module, so a check that cannot fail is caught here too."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from tests.layout import layers

ROOT = Path(__file__).resolve().parents[2]
MAX_CLASS_LINES = 200
MAX_PARAMS = 6  # self and cls not counted; *args and **kwargs are a parameter each


def product_files(root: Path) -> list[Path]:
    return sorted(p for top in layers.PRODUCT for p in (root / top).rglob("*.py"))


def parsed(root: Path) -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(root)), ast.parse(p.read_text(), str(p)))
            for p in product_files(root)]


def big_classes(modules: list[tuple[str, ast.Module]]) -> list[str]:
    return [f"{path}:{node.lineno} {node.name} is {node.end_lineno - node.lineno + 1} lines"
            for path, tree in modules for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_CLASS_LINES]


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return (len([n for n in names if n not in ("self", "cls")])
            + (a.vararg is not None) + (a.kwarg is not None))


def long_signatures(modules: list[tuple[str, ast.Module]]) -> list[str]:
    return [f"{path}:{node.lineno} {node.name} takes {_params(node)}"
            for path, tree in modules for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and _params(node) > MAX_PARAMS]


def twice_defined(modules: list[tuple[str, ast.Module]]) -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path}:{node.lineno}")
    return {name: places for name, places in where.items() if len(places) > 1}


def test_no_class_is_over_200_lines() -> None:
    found = big_classes(parsed(ROOT))
    assert not found, "\n".join(found)


def test_no_function_takes_more_than_six_parameters() -> None:
    found = long_signatures(parsed(ROOT))
    assert not found, "\n".join(found)


def test_no_class_name_is_defined_twice() -> None:
    found = twice_defined(parsed(ROOT))
    assert not found, "\n".join(f"{k}: {v}" for k, v in found.items())


def test_one_module_is_named_options() -> None:
    assert [str(p.relative_to(ROOT)) for p in product_files(ROOT)
            if "options" in p.name] == ["fleetgen/settings/runoptions.py"]


MADE_UP = '''
class Big:
''' + "    x = 1\n" * MAX_CLASS_LINES + '''
def wide(a, b, c, d, e, f, *rest): ...
class Twice: ...
def inner():
    class Twice: ...
    def fine(self, a, b, c, d, e, f): ...
'''


@pytest.mark.parametrize(("check", "caught"), [
    (big_classes, ["made_up.py:2 Big is 201 lines"]),
    (long_signatures, ["made_up.py:204 wide takes 7"]),
    (twice_defined, {"Twice": ["made_up.py:205", "made_up.py:207"]}),
])
def test_each_check_catches_what_it_is_for(check: object, caught: object) -> None:
    assert callable(check)
    assert check([("made_up.py", ast.parse(MADE_UP))]) == caught
