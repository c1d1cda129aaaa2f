"""The floors of the product and the rule between them, read from the source with `ast`.

Bottom to top: the package root (its version, the error hierarchy, the exit codes), the settings
(environment variables, run options), the queue's wire and its Redis, the run state and the
output records (side by side), the engines, the roles (producer, workers, simulator, exporter,
drainer), the top (the CLI, the local fleet, the monitor). A module may import its own floor and
the floors below, never one above; two rooms on the run state's floor or on the roles floor
never import each other; the simulator imports no product code at all (it stands in for a
server fleetgen did not write). Imports inside functions and under TYPE_CHECKING count like any
other.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# (package prefix, floor). The longest matching prefix names a module's room.
ROOMS: tuple[tuple[str, int], ...] = (
    ("fleetgen", 0),  # the package root: __version__, errors.py, exitcodes.py
    ("fleetgen.settings", 1),
    ("fleetgen.queue", 2),
    ("fleetgen.runstate", 3),
    ("fleetgen.records", 3),
    ("fleetgen.engine", 4),
    ("producer", 5),
    ("workers", 5),
    ("fleetgen.simulator", 5),
    ("fleetgen.exporter", 5),
    ("fleetgen.drainer", 5),
    ("fleetgen.cli", 6),
    ("fleetgen.local", 6),
    ("fleetgen.monitor", 6),
    ("fleetgen.__main__", 6),
)
STATE_FLOOR = 3
ROLES_FLOOR = 5
# Floors whose rooms stand side by side: none imports another.
APART = (STATE_FLOOR, ROLES_FLOOR)
PRODUCT = ("fleetgen", "producer", "workers")
ABOVE_EVERYTHING = ("bench", "tests")


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.imported}: {self.why}"


def room(module: str) -> tuple[str, int] | None:
    best: tuple[str, int] | None = None
    for prefix, floor in ROOMS:
        if (module == prefix or module.startswith(prefix + ".")) and \
                (best is None or len(prefix) > len(best[0])):
            best = (prefix, floor)
    return best


def product_modules(root: Path) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """Every module `module` imports, anywhere in its file, as absolute dotted names."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                candidate = f"{base}.{alias.name}" if base else alias.name
                found.append((node.lineno, candidate if candidate in known else base))
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    anchor = ".".join(parts[: len(parts) - node.level + 1])
    return f"{anchor}.{node.module}" if node.module else anchor


def check(root: Path) -> list[Violation]:
    modules = product_modules(root)
    known = set(modules)
    violations: list[Violation] = []
    for module, path in modules.items():
        for line, imported in imports_of(module, path, known):
            why = _why_not(module, imported)
            if why:
                violations.append(Violation(module, line, imported, why))
    return violations


def _why_not(module: str, imported: str) -> str | None:
    top = imported.split(".")[0]
    if top in ABOVE_EVERYTHING:
        return "bench/ and tests/ stand above the product"
    if top not in PRODUCT:
        return None  # the standard library or a dependency
    here, there = room(module), room(imported)
    assert here is not None and there is not None, (module, imported)
    if here[0] == "fleetgen.simulator" and there[0] != "fleetgen.simulator":
        return "the simulator imports no product code"
    if there[1] > here[1]:
        return f"floor {there[1]} ({there[0]}) is above floor {here[1]} ({here[0]})"
    if here[1] == there[1] and here[1] in APART and here[0] != there[0]:
        return f"rooms {here[0]} and {there[0]} stand on the same floor"
    return None
