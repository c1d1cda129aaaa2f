"""`fleetgen demo --flower PORT`: Flower comes up with basic auth against the demo's Valkey."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import httpx
import pytest

from fleetgen.errors import ConfigError
from fleetgen.local.flower import basic_auth
from fleetgen.local.ports import lease_port
from tests.support.ops import VENV_BIN, venv_env
from tests.support.pipeline import make_prompts


def test_demo_serves_flower_with_a_generated_password(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    make_prompts(prompts, 20, seed=4)
    # The user's port: leased, so no other test is handed it while the demo runs.
    lease = lease_port()
    port = lease.port
    demo = subprocess.Popen(
        [str(VENV_BIN / "fleetgen"), "demo", "--gpus", "1", "--prompts", str(prompts),
         "--out", str(tmp_path / "out"), "--flower", str(port), "--slots", "4",
         "--tpot-ms", "4", "--output-tokens-mean", "200", "--max-output-tokens", "256"],
        env=venv_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL, text=True)
    try:
        assert demo.stdout is not None
        lines = []
        for line in demo.stdout:  # the demo prints Flower's address before the run starts
            lines.append(line)
            if "Flower at" in line:
                break
        found = re.search(r"Flower at (http://127\.0\.0\.1:\d+)/workers \(user (\S+), "
                          r"password (\S+)\)", "".join(lines))
        assert found, lines
        url, user, password = found.groups()
        assert url == f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/workers", timeout=10).status_code == 401
        assert httpx.get(url + "/workers", auth=(user, password), timeout=10).status_code == 200
        rest, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        lease.close()
    # Not a terminal: the demo does not linger; it prints the summary and exits 0.
    assert demo.returncode == 0, rest
    assert re.search(r"complete\s+yes", rest), rest
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/healthcheck", timeout=2)


def test_flower_credentials_come_from_the_environment_or_are_generated() -> None:
    assert basic_auth({"FLOWER_BASIC_AUTH": "alice:pw1,bob:pw2"}) == ("alice:pw1,bob:pw2", False)
    generated, made_up = basic_auth({})
    assert made_up and generated.startswith("fleetgen:") and len(generated) > 20
    assert generated != basic_auth({})[0]
    for bad in ("nopassword", ":pw", "alice:pw,bob"):
        with pytest.raises(ConfigError):
            basic_auth({"FLOWER_BASIC_AUTH": bad})
