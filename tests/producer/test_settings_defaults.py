"""Each producer default is written once, in fleetgen/settings/runoptions.py, which ProducerSettings
and the flags of `fleetgen produce` and `fleetgen demo` take theirs from. Fails if a flag's
default drifts from its field's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from fleetgen.cli.main import build_parser
from fleetgen.cli.produce import settings_from
from producer.settings import ProducerSettings, setting_default

FIELDS = set(ProducerSettings.__dataclass_fields__)
# How a flag's value becomes its field's: argparse's `append` needs a list (or None), the
# template options arrive as JSON text.
AS_FIELD = {"stop_if": tuple, "engine_url": lambda v: tuple(v or ()),
            "chat_template_kwargs": json.loads}
# Given on the command line in these tests, or the demo's own flags (its output directory, its
# simulated servers' context, a batch it picks itself unless given).
NOT_DEFAULTS = {"produce": {"run", "input", "context_length"},
                "demo": {"out", "context_length", "batch_size"}}


@pytest.fixture(autouse=True)
def _no_engine_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLEETGEN_ENGINE_PROTOCOL", "FLEETGEN_ENGINE_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def _parse(*argv: str) -> tuple[argparse.Namespace, list[argparse.Action]]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser.parse_args(argv), subparsers.choices[argv[0]]._actions


def _flag_defaults(command: str, args: argparse.Namespace,
                   actions: list[argparse.Action]) -> dict[str, Any]:
    """Every flag that sets a ProducerSettings field and was not given, as the field's value."""
    return {a.dest: AS_FIELD.get(a.dest, lambda v: v)(getattr(args, a.dest))
            for a in actions if a.dest in FIELDS - NOT_DEFAULTS[command]}


@pytest.mark.parametrize("argv", [
    ("produce", "in.jsonl", "--run", "r", "--context-length", "100"),
    ("demo",),
])
def test_every_flag_default_is_its_fields(argv: tuple[str, ...]) -> None:
    args, actions = _parse(*argv)
    defaults = _flag_defaults(argv[0], args, actions)
    assert len(defaults) >= 12, sorted(defaults)  # the flags were found at all
    assert defaults == {name: setting_default(name) for name in defaults}


def test_produce_without_flags_builds_the_default_settings() -> None:
    args, _ = _parse("produce", "in.jsonl", "--run", "r", "--context-length", "100")
    built = settings_from(args, "redis://localhost:1/0")
    assert built == ProducerSettings(input=Path("in.jsonl"), run="r",
                                     redis_url="redis://localhost:1/0", context_length=100)


def test_a_default_is_read_from_the_dataclass() -> None:
    assert setting_default("batch_size") == ProducerSettings.__dataclass_fields__[
        "batch_size"].default
    assert setting_default("chat_template_kwargs") == {}
    with pytest.raises(KeyError):
        setting_default("no_such_field")
