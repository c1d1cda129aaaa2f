"""Headless Chromium for the page tests (Debian's chromium and chromium-driver, via Selenium):
one way to start it, with the browser's console and network log kept."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from tests.support.binaries import require_binary

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def require_chromium() -> None:
    for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)):
        require_binary(name, path, "Debian's chromium and chromium-driver drive the browser")


def chromium(auth: tuple[str, str] | None = None) -> Any:
    """A headless Chromium; `auth` (user, password) is sent as a basic-auth header with every
    request (the login typed once into the browser's prompt)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1280,900",
                 "--force-device-scale-factor=1"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setExtraHTTPHeaders",
                               {"headers": {"Authorization": f"Basic {token}"}})
    return driver


def console_errors(driver: Any) -> list[dict[str, Any]]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def statuses(driver: Any, url: str) -> list[int]:
    """HTTP statuses of the responses to `url` the browser received (its performance log)."""
    found = []
    for entry in driver.get_log("performance"):
        message = orjson.loads(entry["message"])["message"]
        if message["method"] == "Network.responseReceived" and \
                message["params"]["response"]["url"] == url:
            found.append(int(message["params"]["response"]["status"]))
    return found
