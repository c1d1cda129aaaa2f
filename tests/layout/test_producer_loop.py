"""The producer's run is one loop that calls down (issue 43, docs/architecture.md): the run
object (producer/loop.py) and its runner take the caller's hooks, and no part below them is
handed a callback to call back up into the run (a `requeue`, a `reassert`, an `each_look`, a
`while_full`); nobody sets an attribute of another object's part from outside (as
`producer.affinity.route_first = wait` did)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The run object and the runner: they take the hooks of whoever runs them.
LOOP = ("producer/loop.py", "producer/runner.py")
# Callables a part may take, each a pure question asked of data, not a way back up.
ASKED = {
    "wanted": "which slots a pass keeps (producer/inputpass.py)",
    "should_stop": "the caller's stop flag, read while EarlyStop lets the sent finish",
    "convert": "a row option's converter (producer/rowsampling.py)",
    "ok": "a row option's check (producer/rowsampling.py)",
}
# Third-party objects configured as their libraries document it.
CONFIGURED = ("app.conf.", "backend.model.")


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def callback_parameters(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in node.args.args + node.args.kwonlyargs:
                if arg.annotation is not None and "Callable" in ast.unparse(arg.annotation) \
                        and arg.arg not in ASKED:
                    found.append(f"{shown(path)}:{node.lineno} {node.name}({arg.arg})")
    return found


def test_no_part_below_the_run_object_is_handed_a_callback() -> None:
    parts = [p for p in modules("producer") if str(p.relative_to(ROOT)) not in LOOP]
    assert parts
    assert [c for p in parts for c in callback_parameters(p)] == []


def test_a_callback_is_found() -> None:
    assert callback_parameters(ROOT / "producer/loop.py")  # its hooks: on_batch, on_tick


def outside_settings(path: Path) -> list[str]:
    """`a.b.c = ...` where `a` is not self: an attribute of another object's part, set."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute):
                text = ast.unparse(target)
                if not text.startswith(("self.", *CONFIGURED)):
                    found.append(f"{shown(path)}:{node.lineno} {text}")
    return found


def test_nobody_sets_a_part_of_the_producer_from_outside(tmp_path: Path) -> None:
    assert [s for p in modules("producer", "bench", "fleetgen/cli")
            for s in outside_settings(p)] == []
    sample = tmp_path / "sample.py"
    sample.write_text("producer.affinity.route_first = True\nself.outbox.progress = 1\n")
    assert [s.split(" ", 1)[1] for s in outside_settings(sample)] == [
        "producer.affinity.route_first"]

