"""Flower in a real browser (headless Chromium): logged in, it shows the gpuN workers online
and the tasks each one ran. (What needs no browser is in test_flower_auth.py.)"""

from __future__ import annotations

import secrets
import shutil
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetgen.local.fleet import LocalFleet
from tests.support.binaries import require_binary
from tests.support.content import assert_fleet_content
from tests.support.fleet import sim_fleet
from tests.support.ops import REPO, start_flower_leased
from tests.support.pipeline import assert_exactly_once, make_prompts, run_pipeline
from tests.support.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT = REPO / "out" / "screenshots" / "flower-workers.png"


@pytest.fixture(scope="module")
def flower_fleet(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[LocalFleet, str, tuple[str, str]]]:
    for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)):
        require_binary(name, path, "Debian's chromium and chromium-driver drive the browser")
    fleet = sim_fleet(tmp_path_factory.mktemp("flower"), gpus=2, context_length=4096,
                      max_running_requests=8, ttft_ms=5, tpot_ms=0.5, output_tokens_mean=100,
                      task_events=True)
    lease = None
    try:
        fleet.start()
        auth = ("ops", secrets.token_urlsafe(12))
        # The same helper `fleetgen demo --flower` uses: credentials via FLOWER_BASIC_AUTH.
        _, lease = start_flower_leased(fleet.procs, fleet.redis_url, f"{auth[0]}:{auth[1]}")
        yield fleet, f"http://127.0.0.1:{lease.port}", auth
    finally:
        fleet.stop()
        if lease is not None:  # only once Flower is gone
            lease.close()


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1400,900"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def _login(driver: Any, user: str, password: str) -> None:
    """Basic auth as a header on every request the page makes (its XHR refreshes too)."""
    import base64

    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                           {"headers": {"Authorization": f"Basic {token}"}})


def _table(driver: Any) -> dict[str, dict[str, str]]:
    """The workers table as the user sees it: worker -> column -> cell text. Read in one
    script call: the page re-renders the table on every refresh."""
    heads, rows = driver.execute_script("""
        const t = document.querySelector('#workers-table');
        if (!t) return [[], []];
        const text = (cells) => Array.from(cells).map(c => c.textContent.trim());
        return [text(t.querySelectorAll('thead th')),
                Array.from(t.querySelectorAll('tbody tr')).map(r => text(r.cells))];""")
    return {cells[0]: dict(zip(heads, cells, strict=True)) for cells in rows
            if len(cells) == len(heads) and "@" in cells[0]}


def test_flower_in_chromium_shows_gpu_workers_and_their_task_counts(
        flower_fleet: tuple[LocalFleet, str, tuple[str, str]], tmp_path: Path,
        artifact: Callable[[str], None]) -> None:
    fleet, url, auth = flower_fleet
    host = socket.gethostname()
    workers = [f"gpu0@{host}", f"gpu1@{host}"]
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 60, seed=3)
    summary = run_pipeline(fleet, prompts, "flower-run", tmp_path / "out",
                           max_output_tokens=256)
    data = assert_exactly_once(tmp_path / "out", set(kinds["good"]))
    assert summary["done"] == 60
    assert assert_fleet_content(fleet, prompts, data) == 60
    per_worker = Counter(r["worker"] for r in data["results"])

    driver = _driver()
    try:
        _login(driver, *auth)
        driver.get(url + "/workers")
        shown: dict[str, dict[str, str]] = {}

        def counts_shown() -> bool:
            nonlocal shown
            shown = _table(driver)
            # Active comes from the workers' heartbeat events (every 2 s): wait for the one
            # after the run, so the screenshot shows the finished state.
            return all(shown.get(w, {}).get("Succeeded") == str(per_worker[w])
                       and shown[w].get("Active") == "0" for w in workers)

        # The page refreshes itself from Flower's event state; no reload needed.
        wait_until(counts_shown, 30, f"Flower to show {dict(per_worker)} succeeded tasks",
                   poll_s=0.5)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SCREENSHOT))
        shutil.copy(SCREENSHOT, tmp_path / SCREENSHOT.name)
        artifact(f"Flower workers page screenshot: {SCREENSHOT}")
        for w in workers:
            assert shown[w]["Status"].lower() == "online", shown[w]
            assert int(shown[w]["Processed"]) == per_worker[w] > 0, shown[w]
            assert shown[w]["Failed"] == "0"
        assert sum(int(shown[w]["Succeeded"]) for w in workers) == 60
    finally:
        driver.quit()
