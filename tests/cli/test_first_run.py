"""What a new user meets on the first run (issue 22, point 5): the README says how to run the
installed CLI and where the demo's output is; an engine URL without a scheme, a Redis error
after --redis, and a bad request option to the demo are each one line that names the cause,
the last before the demo starts anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgen.local.ports import lease_port
from tests.support.sim import StartSim

ROOT = Path(__file__).resolve().parents[2]


def fleetgen(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_the_readme_says_how_to_run_the_cli_and_where_the_demo_output_is() -> None:
    readme = (ROOT / "README.md").read_text()
    first = readme[:readme.index("## The problem")]
    assert ".venv/bin/fleetgen" in first and "source .venv/bin/activate" in first
    assert "out/demo/" in first and "report.html" in first
    # Then the whole job on one's own servers, and where the rest is (issue 31).
    assert first.index("make demo") < first.index("fleetgen run prompts.jsonl --engine-url")
    assert "docs/cluster.md" in first and "Procfile.sim" in first
    # Figures tied to a commit live in docs/performance.md, not in the README.
    assert "commit bd38a9a" not in readme and "perf:summary" not in readme


def test_an_engine_url_without_a_scheme_is_named(start_sim: StartSim, redis_url: str,
                                                 tmp_path: Path) -> None:
    sim = start_sim()  # the server is up: the message must not ask whether it is
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n')
    hostport = sim.url.removeprefix("http://")
    for argv in (("produce", str(prompts), "--run", "s", "--engine-url", hostport,
                  "--redis", redis_url), ("doctor", "--engine-url", hostport)):
        done = fleetgen(*argv)
        assert done.returncode == 3, done.stderr
        assert f"has no scheme: give http://{hostport}" in done.stderr
        assert "server up" not in done.stderr and done.stderr.count("\n") == 1


def test_a_redis_error_names_the_flag_that_was_given() -> None:
    lease = lease_port()  # a port nothing listens on
    url = f"redis://127.0.0.1:{lease.port}/0"
    try:
        flag = fleetgen("status", "--redis", url)
        env = fleetgen("status", env={"FLEETGEN_REDIS_URL": url})
    finally:
        lease.close()
    assert flag.returncode == env.returncode == 4
    assert "check --redis" in flag.stderr and "FLEETGEN_REDIS_URL" not in flag.stderr
    assert "check FLEETGEN_REDIS_URL" in env.stderr and "--redis" not in env.stderr
    bad = fleetgen("status", "--redis", "http://127.0.0.1:6379")
    assert bad.returncode == 3 and bad.stderr.startswith("fleetgen status: --redis must be")


@pytest.mark.parametrize(("option", "message"), [
    (("--n", "0"), "--n must be in 1..128, got 0"),
    (("--logprobs", "21"), "--logprobs must be in 0..20, got 21"),
])
def test_the_demo_refuses_a_bad_request_option_before_starting(
        tmp_path: Path, option: tuple[str, str], message: str) -> None:
    done = fleetgen("demo", "--out", str(tmp_path / "out"), *option)
    assert done.returncode == 3
    assert done.stderr == f"fleetgen demo: {message}\n"
    assert "starting" not in done.stdout, "the fleet was started before the options were checked"


@pytest.mark.parametrize("where", ["a-file/out", "a-file"])
def test_an_output_directory_that_cannot_be_used_is_one_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    done = subprocess.run([sys.executable, "-m", "fleetgen", "demo", "--out", where],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"fleetgen demo: cannot write in {where}: ")
    assert "starting" not in done.stdout, "the fleet was started before --out was checked"
