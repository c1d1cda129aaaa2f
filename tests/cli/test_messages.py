"""What the commands say names what the command has: no flag it lacks, no Python word (`None`)
in a help text or a message."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fleetgen.cli.main import build_parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_no_help_shows_python_none(command: str) -> None:
    text = subcommands()[command].format_help()
    assert "None" not in text, [line for line in text.splitlines() if "None" in line]


def test_the_demo_says_how_it_starts_another_run(tmp_path: Path) -> None:
    # The demo has no --run: its run lives in its --out, and a resume that does not match
    # says to use another --out (producer/manifest.py's message takes it from the settings).
    from fleetgen.cli import demo, produce

    args = build_parser().parse_args(["demo", "--out", str(tmp_path)])
    settings = demo._settings(args, demo.sample_prompts(), "demo-x")
    assert settings.new_run == "use another --out (the run is recorded there)"
    assert settings.batch_size == 512  # the help's default is the one it takes
    plain = build_parser().parse_args(["produce", "p.jsonl", "--run", "r",
                                       "--context-length", "4096"])
    assert produce.settings_from(plain, "redis://x").new_run == "use a new --run name"
