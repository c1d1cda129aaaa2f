"""One reading of engine URLs for every command that takes them (fleetgen/engine/urls.py):
a range of ports, a comma list and repeated flags name the same servers; anything else is one
line naming the flag, never httpx's InvalidURL traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetgen import exitcodes
from fleetgen.engine import engine_urls, one_engine_url
from fleetgen.errors import ConfigError
from fleetgen.local.ports import lease_port
from fleetgen.simulator import SimConfig, run_in_thread


def test_a_range_a_comma_list_and_repeated_flags_name_the_same_servers() -> None:
    three = ["http://10.0.0.2:30000", "http://10.0.0.2:30001", "http://10.0.0.2:30002"]
    assert engine_urls(["http://10.0.0.2:30000-30002"]) == three
    assert engine_urls(["http://10.0.0.2:30000, http://10.0.0.2:30001,http://10.0.0.2:30002"]) \
        == three
    assert engine_urls(["http://10.0.0.2:30000,http://10.0.0.2:30001",
                        "http://10.0.0.2:30002"]) == three
    assert engine_urls(["http://10.0.0.2:30000-30001/v1,http://h:1"]) == [
        "http://10.0.0.2:30000/v1", "http://10.0.0.2:30001/v1", "http://h:1"]
    assert engine_urls(["http://[::1]:30000-30001"]) == ["http://[::1]:30000",
                                                         "http://[::1]:30001"]
    assert one_engine_url("http://h:1") == "http://h:1"


@pytest.mark.parametrize(("value", "needle"), [
    ("http://127.0.0.1:3100x", "is not a URL (Invalid port: '3100x')"),
    ("http://127.0.0.1:31000-", "is not a URL"),
    ("http://h:1,", "an empty item in the comma list"),
    ("127.0.0.1:31000", "has no scheme: give http://127.0.0.1:31000"),
    ("http://h:2-1", "the port range 2-1 is empty"),
    ("http://h:1-2,http://h:2", "http://h:2 named twice"),
    ("http://h:30000-33999", "a range names at most 64"),
])
def test_anything_else_is_one_config_error(value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        engine_urls([value])
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def fleetgen(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetgen", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("command", ["run", "doctor", "produce", "check"])
def test_a_bad_url_is_one_line_in_every_command(tmp_path: Path, command: str) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    before = {"run": ["run", "p.jsonl", "--out", "out"], "doctor": ["doctor"],
              "produce": ["produce", "p.jsonl", "--run", "r"], "check": ["check"]}[command]
    done = fleetgen(tmp_path, *before, "--engine-url", "http://127.0.0.1:3100x")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == exitcodes.CONFIG, done.stderr
    assert done.stderr.splitlines() == [
        f"fleetgen {command}: --engine-url 'http://127.0.0.1:3100x' is not a URL (Invalid "
        "port: '3100x'); give http://HOST:PORT, http://HOST:FIRST-LAST for a range of ports, "
        "or a comma list"]
    assert not (tmp_path / "out").exists()


@pytest.fixture()
def three_servers() -> Iterator[list[int]]:
    """Three simulated servers on a leased block of consecutive ports, over real HTTP."""
    with lease_port(count=3) as lease:
        ports = lease.ports
    sims = run_in_thread(SimConfig(port=ports[0], count=3, ttft_ms=0.0, tpot_ms=0.0,
                                   health_delay_s=0.0, context_length=4096))
    try:
        assert sims.urls == [f"http://127.0.0.1:{p}" for p in ports]
        yield ports
    finally:
        sims.stop()


def test_doctor_takes_the_range_the_readme_shows_for_run(tmp_path: Path,
                                                         three_servers: list[int]) -> None:
    # The servers were started before (as a user's are); doctor is a command of its own.
    first, last = three_servers[0], three_servers[-1]
    ranged = fleetgen(tmp_path, "doctor", "--engine-url", f"http://127.0.0.1:{first}-{last}")
    assert ranged.returncode == exitcodes.OK, ranged.stdout + ranged.stderr
    listed = fleetgen(tmp_path, "doctor", "--engine-url",
                      f"http://127.0.0.1:{first},http://127.0.0.1:{first + 1}",
                      "--engine-url", f"http://127.0.0.1:{last}")
    assert listed.returncode == exitcodes.OK, listed.stdout + listed.stderr
    for done in (ranged, listed):
        rows = [line.split()[0] for line in done.stdout.splitlines()
                if line.startswith("http://127.0.0.1:")]
        assert sorted(set(rows)) == [f"http://127.0.0.1:{p}" for p in three_servers], \
            done.stdout
