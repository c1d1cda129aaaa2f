"""What the commands say names what the command has: no flag it lacks, no Python word (`None`)
in a help text or a message."""

from __future__ import annotations

import argparse
import subprocess
import sys
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


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_command_describes_itself_not_its_module(command: str) -> None:
    # A command's --help description is the last paragraph of its module's docstring
    # (fleetgen/cli/flags.py subcommand): a module docstring without it would show the
    # module's role, written for the reader of the code, or nothing.
    parser = subcommands()[command]
    assert parser.description and len(parser.description) > 60, parser.description
    assert not parser.description.startswith("`fleetgen"), parser.description
    assert "\n" not in parser.description


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


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_option_says_what_it_is(command: str) -> None:
    bare = [a.option_strings[0] for a in subcommands()[command]._actions
            if a.option_strings and not a.help]
    assert not bare, f"fleetgen {command}: no help for {bare}"


def test_a_mistyped_flag_shows_the_commands_usage_and_the_flag_meant(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "fleetgen", "run", "p.jsonl", "--engine-url",
                           "http://127.0.0.1:1", "--out", "out", "--max-ouput-tokens", "50"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("usage: fleetgen run "), done.stderr
    assert done.stderr.splitlines()[-1] == (
        "fleetgen run: error: unrecognized arguments: --max-ouput-tokens 50 (did you mean "
        "--max-output-tokens?)")
    assert not (tmp_path / "out").exists()


def test_status_of_a_finished_run_says_where_its_figures_are(tmp_path: Path) -> None:
    """`status` after a finished run could not reach Redis, and said only that: the run's
    embedded Valkey stopped with it. The line names summary.json and the report."""
    from fleetgen.local.ports import lease_port

    with lease_port() as lease:  # nobody listens: the finished run's Valkey is gone
        done = subprocess.run([sys.executable, "-m", "fleetgen", "status", "--run", "x",
                               "--redis", f"redis://127.0.0.1:{lease.port}/0"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    assert "cannot reach Redis" in done.stderr and "OUT/summary.json" in done.stderr
    assert "fleetgen report OUT" in done.stderr and "Traceback" not in done.stderr
