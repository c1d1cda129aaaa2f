"""fleetgen/settings/runoptions.py is the one table of run options: the flags of produce, run and
demo come from it, the settings take their defaults from it, the manifest pins and summary.json
keeps what it says, and docs/options.md is generated from it."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen.cli.main import build_parser
from fleetgen.errors import ConfigError
from fleetgen.settings import runoptions
from fleetgen.settings.runoptions import PINNED, STORED, SUMMARY_SETTINGS, TABLE
from producer.manifest import check_same_settings
from producer.settings import ProducerSettings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import options_table  # noqa: E402

# The names the manifest and summary.json have always stored them under: a run started by an
# older fleetgen resumes, an old summary.json exports.
PINNED_BEFORE = {"input", "files", "tokenizer", "context_length", "max_output_tokens",
                 "min_output_tokens", "margin", "reserved_tokens", "max_req_input_len",
                 "sampling", "n", "logprobs", "token_ids", "json_schema", "chat_template_kwargs",
                 "reasoning", "turns"}
STORED_BEFORE = PINNED_BEFORE | {"engine_url", "engine_protocol", "redis"}
SUMMARY_BEFORE = {"tokenizer", "chat_template_kwargs", "token_ids", "logprobs", "reasoning",
                  "n", "sampling", "context_length", "max_output_tokens", "turns"}
# Flags run and demo declare themselves (runoptions' docstring says why), by dest.
OWN = {"run": {"engine_url", "engine_protocol", "out", "run", "redis"},
       "demo": {"out", "context_length"}}
# ProducerSettings fields that are no option of the table: a secret from the environment,
# a tuning constant, and the command's own words for "start another run".
NOT_OPTIONS = {"engine_api_key", "affinity_wait_s", "new_run"}


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def test_docs_options_is_generated_from_the_table() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "options_table.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_the_table_names_each_options_flag_setting_commands_and_where_it_is_kept() -> None:
    text = options_table.fill("<!-- options -->\n<!-- /options -->\n")
    assert text is not None
    assert ("| `--max-output-tokens` | `max_output_tokens` | produce, run, demo | integer | "
            "whatever the context leaves | pinned, summary.json |") in text
    assert "| `--temperature` | `temperature` | produce, run, demo | number | unset | in " \
        "`sampling` |" in text


def test_stored_names_are_the_ones_runs_were_started_with() -> None:
    # A new option adds a name (a run from before it lacks the key, and passes the check); a
    # renamed or dropped one would refuse, or silently stop checking, every older run.
    assert set(PINNED) >= PINNED_BEFORE and len(set(PINNED)) == len(PINNED)
    assert {o.stored_as for o in STORED} >= STORED_BEFORE
    assert set(SUMMARY_SETTINGS) >= SUMMARY_BEFORE
    assert not {o.stored_as for o in TABLE if o.kept.summary and o.secret}
    assert len({o.name for o in TABLE}) == len(TABLE)


@pytest.mark.parametrize("command", runoptions.COMMANDS)
def test_every_option_flag_of_a_command_is_the_tables(command: str) -> None:
    """No flag that fills a setting is declared beside the table (but the few run and demo
    own), and every entry for the command is there, with its help."""
    actions = {a.dest: a for a in _subparser(command)._actions}
    by_attr = {o.attr: o for o in TABLE}
    from_table = {o.attr for o in runoptions.flags_of(command)}
    assert from_table <= set(actions)
    for dest, action in actions.items():
        if dest in by_attr and action.option_strings and dest not in OWN.get(command, set()):
            option = by_attr[dest]
            assert dest in from_table, f"{command} declares {action.option_strings} itself"
            assert tuple(action.option_strings) == option.flags
            assert action.help == option.argparse_kwargs(command)["help"]
    assert len(from_table) >= (30 if command == "produce" else 20)


def test_settings_take_their_defaults_from_the_table() -> None:
    fields = {f.name: f for f in dataclasses.fields(ProducerSettings)}
    options = {o.name for o in TABLE if o.kept.setting}
    assert options - set(fields) == set(), "a setting of the table with no field"
    assert set(fields) - options == NOT_OPTIONS, "a field that is no option of the table"
    for name in options:
        f = fields[name]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            assert name in ("input", "run", "redis_url"), name  # given, never defaulted
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert default == runoptions.option(name).default, name


def test_the_manifest_stores_the_tables_settings_and_no_secret(tmp_path: Path) -> None:
    settings = ProducerSettings(input=tmp_path / "in.jsonl", run="r",
                                redis_url="redis://:hunter2@db:6379/0", context_length=100,
                                engine_url=("http://a:1",), max_output_tokens=50,
                                sampling={"temperature": 0.5})
    stored = settings.manifest_settings(files=["in.jsonl"])
    assert set(stored) == {o.stored_as for o in STORED} >= STORED_BEFORE
    assert "hunter2" not in str(stored) and stored["redis"].startswith("redis://")
    assert stored["input"] == str((tmp_path / "in.jsonl").resolve())
    assert stored["engine_url"] == ["http://a:1"] and stored["max_output_tokens"] == 50
    assert stored["sampling"] == {"temperature": 0.5}
    assert "files" not in settings.manifest_settings()


@pytest.mark.parametrize("name", sorted(PINNED_BEFORE - {"files"}))
def test_a_changed_pinned_setting_is_refused_naming_its_flag(name: str) -> None:
    option = runoptions.option(name)
    said = option.flags[0] if option.flags else {"sampling": "sampling options"}.get(name, name)
    with pytest.raises(ConfigError, match=f"started with {said} "):
        check_same_settings("r", {name: 1}, {name: 2})
    check_same_settings("r", {}, {name: 2})  # a run from before the setting was pinned


def test_the_sampling_flags_fill_the_sampling_setting() -> None:
    from fleetgen.cli.produce import settings_from

    args = build_parser().parse_args(["produce", "in.jsonl", "--run", "r", "--context-length",
                                      "100", "--temperature", "0.5", "--stop", "x",
                                      "--seed", "3"])
    built = settings_from(args, "redis://localhost:1/0")
    assert built.sampling == {"temperature": 0.5, "stop": ["x"], "seed": 3}
    plain = build_parser().parse_args(["produce", "in.jsonl", "--run", "r", "--context-length",
                                       "100"])
    assert settings_from(plain, "redis://localhost:1/0").sampling == {}


def test_the_default_tokenizer_is_written_once() -> None:
    from producer.qwen_build import QWEN_NAME

    assert runoptions.DEFAULT_TOKENIZER == QWEN_NAME
    for command in ("produce", "doctor", "run", "demo"):
        tokenizer = next(a for a in _subparser(command)._actions if a.dest == "tokenizer")
        assert tokenizer.default == runoptions.DEFAULT_TOKENIZER, command
