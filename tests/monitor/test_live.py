"""The live page's server without a browser: basic auth on every path, read-only, loopback by
default, and status.json carrying what `fleetgen status --json` says (a run written into a
real Valkey by hand)."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import orjson
import pytest
import redis

from fleetgen.errors import ConfigError
from fleetgen.monitor.live import (
    Credentials,
    LivePage,
    credentials_from_env,
    parse_listen,
)
from fleetgen.runstate.keys import RunKeys

RUN = "live-unit"
AUTH = Credentials("ops", "s3cret-pass")


@pytest.fixture()
def live(rclient: redis.Redis) -> Iterator[LivePage]:
    keys = RunKeys(RUN)
    rclient.hset(keys.manifest, mapping={"started_at": "1000", "state": "produced",
                                         "total": "50", "read": "50"})
    rclient.hset(keys.stats, mapping={"done": "30", "failed": "2", "rejected": "3",
                                      "truncated": "4", "completion_tokens": "3000",
                                      "gpu0@h|done": "30", "gpu0@h|completion_tokens": "3000"})
    rclient.hset(keys.failed, mapping={"f1": "{}", "f2": "{}"})  # the 2 failures that stand
    page = LivePage(rclient, RUN, AUTH, port=0, interval_s=0.2).start()
    yield page
    page.stop()


def header(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_every_path_wants_the_login(live: LivePage) -> None:
    for path in ("", "status.json", "nowhere"):
        bare = httpx.get(live.url + path)
        assert bare.status_code == 401, path
        assert bare.headers["WWW-Authenticate"].startswith("Basic realm=")
        assert "30" not in bare.text
        for wrong in (header("ops", "wrong"), header("admin", "s3cret-pass"),
                      {"Authorization": "Basic !!notbase64"}, {"Authorization": "Bearer x"}):
            assert httpx.get(live.url + path, headers=wrong).status_code == 401
    assert httpx.post(live.url + "status.json", content=b"{}").status_code == 401


def test_with_the_login_the_page_is_read_only(live: LivePage) -> None:
    ok = header("ops", "s3cret-pass")
    page = httpx.get(live.url, headers=ok)
    assert page.status_code == 200 and "fleetgenLive" in page.text
    assert "connect-src 'self'" in page.headers["Content-Security-Policy"]
    assert httpx.get(live.url + "nowhere", headers=ok).status_code == 404
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        refused = httpx.request(method, live.url + "status.json", headers=ok)
        assert refused.status_code == 405 and refused.headers["Allow"] == "GET, HEAD"


def test_status_json_is_what_fleetgen_status_says(live: LivePage) -> None:
    snap = orjson.loads(httpx.get(live.url + "status.json",
                                  headers=header("ops", "s3cret-pass")).content)
    s = snap["status"]
    assert (s["run"], s["total"], s["done"], s["failed"], s["rejected"], s["truncated"]) == \
        (RUN, 50, 30, 2, 3, 4)
    assert s["shares"]["failed"] == round(2 / 32, 4)
    assert [w["name"] for w in s["workers"]] == ["gpu0@h"]
    assert snap["history"] and snap["error"] is None


def test_the_server_listens_on_loopback_unless_told(live: LivePage) -> None:
    assert live.url.startswith("http://127.0.0.1:")
    assert parse_listen("8080") == ("127.0.0.1", 8080)
    assert parse_listen("0.0.0.0:8080") == ("0.0.0.0", 8080)
    assert parse_listen("[::1]:9") == ("::1", 9)
    assert parse_listen("0") == ("127.0.0.1", 0)
    for bad in ("http", "host:", "70000", "-1"):
        with pytest.raises(ConfigError, match="HOST"):
            parse_listen(bad)


def test_credentials_come_from_the_environment_and_stay_out_of_repr() -> None:
    creds, generated = credentials_from_env({"FLEETGEN_STATUS_AUTH": "ops:pa:ss"})
    assert (creds.user, creds.password, generated) == ("ops", "pa:ss", False)
    assert "pa:ss" not in repr(creds)
    made, generated = credentials_from_env({})
    assert generated and made.user == "fleetgen" and len(made.password) >= 16
    for bad in ("nopassword", ":x", "x:"):
        with pytest.raises(ConfigError, match="FLEETGEN_STATUS_AUTH"):
            credentials_from_env({"FLEETGEN_STATUS_AUTH": bad})


def test_the_command_serves_until_sigterm_and_prints_its_login(redis_url: str,
                                                              live: LivePage) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetgen", "status", "--run", RUN, "--serve", "0",
         "--redis", redis_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "FLEETGEN_STATUS_AUTH"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/) \(user fleetgen, password (\S+)\)",
                          line)
        assert found, line
        url, password = found.groups()
        assert httpx.get(url).status_code == 401
        page = httpx.get(url + "status.json", headers=header("fleetgen", password))
        assert page.status_code == 200 and orjson.loads(page.content)["status"]["done"] == 30
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_serve_needs_a_run(redis_url: str) -> None:
    done = subprocess.run([sys.executable, "-m", "fleetgen", "status", "--serve", "0",
                           "--redis", redis_url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "--serve needs --run" in done.stderr
