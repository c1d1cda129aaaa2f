"""fleetgen/settings/envvars.py is the one table of FLEETGEN_* variables: every name in the tree is
in it, the table in docs/reference.md is generated from it, and the worker settings take their
names and defaults from it."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen.engine.decision import RetryPolicy
from fleetgen.errors import ConfigError
from fleetgen.settings import envvars
from fleetgen.simulator import cli as sim_cli
from workers.settings import ENV, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import envvars_table  # noqa: E402

NAME = re.compile(r"\bFLEETGEN_[A-Z][A-Z0-9_]*[A-Z0-9]\b")
REDIS = {envvars.REDIS_URL.name: "redis://127.0.0.1:1/0"}


def test_the_reference_table_is_generated_from_the_table() -> None:
    # Fails when someone edits the table in docs/reference.md by hand or adds a variable
    # without regenerating it (python tools/envvars_table.py).
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "envvars_table.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert envvars_table.REFERENCE == ROOT / "docs" / "reference.md"
    # The one table, in the one place the tool checks: a copy elsewhere would go stale.
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    holding = [p.relative_to(ROOT).as_posix() for p in docs if "<!-- envvars -->" in p.read_text()]
    assert holding == ["docs/reference.md"], holding
    assert envvars.REDIS_URL.name in envvars_table.REFERENCE.read_text()


def test_the_table_names_each_variable_its_readers_and_type() -> None:
    text = envvars_table.fill("<!-- envvars -->\n<!-- /envvars -->\n")
    assert text is not None
    assert "| `FLEETGEN_ENGINE_PROTOCOL` | workers, `produce`, `doctor` | protocol name |" in text


def test_every_variable_named_in_the_tree_is_in_the_table() -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    named: dict[str, str] = {}
    for name in files:
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for found in NAME.findall(text):
            named.setdefault(found, name)
    known = {var.name for var in envvars.TABLE}
    assert len(known) == len(envvars.TABLE)
    missing = {n: where for n, where in named.items() if n not in known}
    assert not missing, f"add these to fleetgen/settings/envvars.py: {missing}"
    assert envvars.REDIS_URL.name in named  # the scan reads the tree at all


def test_the_simulator_spells_its_variable_as_the_table_does() -> None:
    # The simulator imports no product code, so it keeps its own copy of the name.
    assert envvars.SIM_API_KEY.name == sim_cli.API_KEY_ENV


def test_worker_settings_take_names_and_defaults_from_the_table() -> None:
    defaults = WorkerSettings.from_env(REDIS)
    for f in dataclasses.fields(WorkerSettings):
        var = f.metadata[ENV]
        assert var in envvars.TABLE
        assert f.repr is not var.secret, f.name
        if f.name != "redis_url":
            assert getattr(defaults, f.name) == var.default, f.name
    policy = RetryPolicy.of(defaults)
    assert policy == RetryPolicy()
    given = WorkerSettings.from_env({**REDIS, envvars.REQUEST_TIMEOUT_S.name: "12",
                                     envvars.MAX_ATTEMPTS.name: "3",
                                     envvars.WAIT_AOF.name: "yes",
                                     envvars.ENGINE_API_KEY.name: "k"})
    assert (given.request_timeout_s, given.max_attempts, given.wait_aof) == (12.0, 3, True)
    assert given.engine_api_key == "k" and "'k'" not in repr(given)


def test_values_parse_and_blanks_count_as_unset() -> None:
    assert envvars.HANDBACK_S.value({envvars.HANDBACK_S.name: ""}) == 30.0
    assert envvars.ENGINE_API_KEY.value({envvars.ENGINE_API_KEY.name: ""}) is None
    assert envvars.ENGINE_URL.given({}) is None
    # An empty engine URL is reported, not replaced by localhost.
    with pytest.raises(ConfigError, match="FLEETGEN_ENGINE_URL must be an http"):
        WorkerSettings.from_env({**REDIS, envvars.ENGINE_URL.name: ""})
    with pytest.raises(ConfigError, match="FLEETGEN_ENGINE_GONE_S must be a number, got 'x'"):
        envvars.ENGINE_GONE_S.value({envvars.ENGINE_GONE_S.name: "x"})
    assert envvars.CACHE_DIR.value({envvars.CACHE_DIR.name: "/c"}) == Path("/c")
