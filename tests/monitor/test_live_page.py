"""The live page as a user opens it: headless Chromium on `fleetgen status --serve`, with the
login in the URL (`http://user:password@host:port/`), over a run written into a real Valkey by
hand (no fleet). The page shows the figures, and turns from green to a warning when its
figures go stale: the run's Redis stops answering, or no worker is alive any more."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis

from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.monitor.live import Credentials, LivePage, Sampler, make_server
from fleetgen.queue.contract import worker_key
from fleetgen.runstate.keys import RunKeys
from tests.support.browser import chromium, console_errors, require_chromium
from tests.support.waiting import wait_until

RUN = "page-run"
USER, PASSWORD = "ops", "page-pass-123"


def write_run(client: redis.Redis, *, worker_alive: bool = True) -> None:
    keys = RunKeys(RUN)
    client.hset(keys.manifest, mapping={"started_at": str(time.time() - 60),
                                        "state": "produced", "total": "50", "read": "50"})
    client.hset(keys.stats, mapping={"done": "30", "rejected": "3", "completion_tokens": "3000",
                                     "gpu0@h|done": "30", "gpu0@h|completion_tokens": "3000"})
    if worker_alive:
        beat(client)


def beat(client: redis.Redis) -> None:
    """The heartbeat a live worker writes every interval (workers/gate.py)."""
    client.hset(worker_key("gpu0@h"), mapping={
        "at": time.time(), "interval_s": 2.0, "lease_s": 30, "sweep_s": 5, "held": 0,
        "healthy": 1, "consuming": 1, "inflight": 4, "concurrency": 8, "engine": "sim"})


def login_url(url: str) -> str:
    """The page's URL with the login in it, as one pastes it into a browser."""
    return url.replace("http://", f"http://{USER}:{PASSWORD}@", 1)


def state(driver: Any) -> tuple[str, str]:
    element = driver.find_element("id", "state")
    return element.text, element.get_attribute("class")


def figure(driver: Any, name: str) -> str | None:
    return driver.execute_script(
        "const td = document.querySelector('[data-figure=\"' + arguments[0] + '\"]');"
        "return td ? td.textContent : null;", name)


@pytest.fixture()
def browser() -> Iterator[Any]:
    require_chromium()
    driver = chromium()
    yield driver
    driver.quit()


def test_the_page_opened_with_its_login_in_the_url_shows_the_run(
        rclient: redis.Redis, browser: Any) -> None:
    write_run(rclient)
    live = LivePage(rclient, RUN, Credentials(USER, PASSWORD), interval_s=0.3).start()
    try:
        browser.get(login_url(live.url))
        wait_until(lambda: state(browser)[0].startswith("state produced"), 20,
                   "the page to show the run's state", poll_s=0.1)
        assert state(browser)[1] == "ok"
        assert figure(browser, "done") == "30" and figure(browser, "total") == "50"
        # Refreshing by itself, with the login the browser kept for the origin.
        updates = int(browser.execute_script("return document.body.dataset.updates"))
        wait_until(lambda: int(browser.execute_script("return document.body.dataset.updates"))
                   > updates, 10, "the page to refresh", poll_s=0.1)
        assert console_errors(browser) == []
    finally:
        live.stop()


@pytest.fixture()
def own_valkey(tmp_path: Path) -> Iterator[EmbeddedValkey]:
    """A Valkey of the test's own, to stop under the page (the session's serves the rest)."""
    server = EmbeddedValkey(tmp_path / "valkey").start()
    yield server
    server.stop()


def serve(redis_url: str) -> tuple[subprocess.Popen[str], str]:
    """`fleetgen status --serve 0` as a user starts it; returns the process and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetgen", "status", "--run", RUN, "--serve", "0",
         "--interval", "0.5", "--redis", redis_url], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FLEETGEN_STATUS_AUTH": f"{USER}:{PASSWORD}"})
    assert proc.stdout is not None
    found = re.search(r"at (http://127\.0\.0\.1:\d+/)", proc.stdout.readline())
    assert found, proc.stderr.read() if proc.stderr else ""
    return proc, found.group(1)


def snapshot(url: str) -> dict[str, Any]:
    answer = httpx.get(url + "status.json", auth=(USER, PASSWORD), timeout=5)
    assert answer.status_code == 200
    return dict(orjson.loads(answer.content))


def test_the_page_says_its_figures_are_stale_once_redis_is_gone(
        own_valkey: EmbeddedValkey, browser: Any) -> None:
    write_run(redis.Redis.from_url(own_valkey.url))
    proc, url = serve(own_valkey.url)
    try:
        browser.get(login_url(url))
        wait_until(lambda: state(browser)[1] == "ok", 20, "a green page", poll_s=0.1)
        own_valkey.stop()  # the run's Redis goes away (a stopped demo takes its Valkey along)
        gone = time.monotonic()
        snap = wait_until(lambda: (s := snapshot(url))["error"] and s, 15,
                          "status.json to carry an error")
        assert "no figures for" in snap["error"] and snap["status"]["done"] == 30
        wait_until(lambda: state(browser)[1] == "warn", 10, "the page to turn from green",
                   poll_s=0.1)
        assert "no figures for" in state(browser)[0]
        assert time.monotonic() - gone < 15
    finally:
        proc.terminate()
        code = proc.wait(timeout=10)
    # SIGTERM stops the page within its grace though its sampler is stuck on the dead Redis,
    # and says nothing about resuming (there is nothing to resume).
    assert code == 0
    assert proc.stderr is not None and "resume" not in proc.stderr.read()


def test_the_page_says_the_run_is_not_moving_once_no_worker_is_alive(
        rclient: redis.Redis, browser: Any) -> None:
    write_run(rclient)
    live = LivePage(rclient, RUN, Credentials(USER, PASSWORD), interval_s=0.3).start()
    try:
        browser.get(login_url(live.url))
        wait_until(lambda: state(browser)[1] == "ok", 20, "a green page", poll_s=0.1)
        rclient.delete(worker_key("gpu0@h"))  # its heartbeat lapsed: the fleet has stopped
        wait_until(lambda: "NOT MOVING" in state(browser)[0], 10, "the page to say so",
                   poll_s=0.1)
        assert state(browser)[1] == "warn"
        assert "no worker is alive" in (live.sampler.snapshot()["idle"] or "")
        beat(rclient)  # a worker is back: green again
        wait_until(lambda: state(browser)[1] == "ok", 10, "a green page again", poll_s=0.1)
    finally:
        live.stop()


def test_a_client_gone_away_prints_nothing_over_the_terminal(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """socketserver's own handle_error prints a traceback to stderr: a browser closing its
    tab mid-answer wrote 20 lines into another test's captured stderr (fresh-clone make test,
    tests/exporter/test_bad_input.py). It is logged at debug now; another error is a warning,
    never a print."""
    server = make_server(Sampler(redis.Redis(port=1), RUN, 1.0), Credentials(USER, PASSWORD))
    try:
        with caplog.at_level(logging.DEBUG, logger="fleetgen"):
            for error in (ConnectionResetError(104, "Connection reset by peer"),
                          ValueError("a bug")):
                try:
                    raise error
                except Exception:
                    server.handle_error(None, ("127.0.0.1", 36516))
    finally:
        server.server_close()
    assert capsys.readouterr().err == ""
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels[0][0] == logging.DEBUG and "went away" in levels[0][1], levels
    assert levels[1][0] == logging.WARNING and "failed" in levels[1][1], levels
