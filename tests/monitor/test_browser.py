"""The report and the live page in a real browser (headless Chromium): a real run on a local
fleet, watched by the live page while it runs, then reported from its output directory. Every
chart is drawn (non-zero size, the series' own colour on its canvas), the figures shown equal
summary.json and `fleetgen status --json`, the console stays clean, and the screenshots are kept
(under the test's tmp dir and out/screenshots/; docs/ holds the copies docs/report.md shows)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgen.cli.main import main
from fleetgen.local.fleet import LocalFleet
from fleetgen.monitor.live import Credentials, LivePage
from fleetgen.monitor.report import build
from fleetgen.queue.redisconn import connect
from tests.support.browser import chromium, console_errors, require_chromium, statuses
from tests.support.fleet import sim_fleet
from tests.support.pipeline import make_prompts, run_pipeline
from tests.support.waiting import wait_until

pytestmark = pytest.mark.fleet  # starts a fleet and a browser

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "out" / "screenshots"
RUN = "browser-run"
AUTH = Credentials("ops", "browser-pass-123")
# The first series' colour in page.js: its stroke is drawn opaque on every chart.
SERIES_RGB = (0x25, 0x63, 0xEB)
REPORT_CHARTS = {"chart-completion", "chart-reasoning", "chart-reasoning-share", "chart-finish",
                 "chart-prompt", "chart-worker-rows", "chart-worker-tokens", "chart-throughput"}
LIVE_CHARTS = {"chart-rates", "chart-queue", "chart-worker-rows", "chart-worker-tokens"}


class WatchedRun:
    """A run on a local fleet, produced and drained on a thread, watched by the live page
    from before its first row; `finished()` waits for it and returns its summary."""

    def __init__(self, fleet: LocalFleet, live: LivePage, out: Path, prompts: Path) -> None:
        self.fleet, self.live, self.out = fleet, live, out
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(prompts,), daemon=True)
        self.thread.start()

    def _run(self, prompts: Path) -> None:
        try:
            self.summary = run_pipeline(self.fleet, prompts, RUN, self.out,
                                        max_output_tokens=120, reasoning="split")
        except BaseException as exc:
            self.error = exc

    def finished(self) -> dict[str, Any]:
        self.thread.join(timeout=240)
        if self.error is not None:
            raise self.error
        assert self.summary is not None, "the run did not finish in 240 s"
        return self.summary


@pytest.fixture(scope="module")
def watched_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchedRun]:
    """Some rows truncated at their budget, some rejected too long or malformed; the run's
    keys stay in Redis after it ends, so the live page keeps showing it."""
    require_chromium()
    work = tmp_path_factory.mktemp("browser")
    fleet = sim_fleet(work, gpus=2, context_length=4096, max_running_requests=8, ttft_ms=5,
                      tpot_ms=8, output_tokens_mean=80)
    live = None
    watched = None
    try:
        fleet.start()
        live = LivePage(connect(fleet.redis_url), RUN, AUTH, interval_s=0.5).start()
        prompts = work / "prompts.jsonl"
        make_prompts(prompts, 200, too_long=3, malformed=2, seed=5)
        watched = WatchedRun(fleet, live, work / "out", prompts)
        yield watched
    finally:
        if watched is not None:
            watched.thread.join(timeout=240)
        if live is not None:
            live.stop()
        fleet.stop()


def _driver(auth: Credentials | None = None) -> Any:
    return chromium(None if auth is None else (auth.user, auth.password))


CHARTS_JS = """
const [r, g, b] = arguments[0];
return Array.from(document.querySelectorAll('.chart')).map(box => {
  const canvas = box.querySelector('canvas');
  if (!canvas) return [box.id, 0, 0, 0];
  const img = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let ink = 0;
  for (let i = 0; i < img.length; i += 4)
    if (Math.abs(img[i] - r) < 8 && Math.abs(img[i + 1] - g) < 8 && Math.abs(img[i + 2] - b) < 8
        && img[i + 3] > 200) ink++;
  const rect = canvas.getBoundingClientRect();
  return [box.id, Math.round(rect.width), Math.round(rect.height), ink];
});"""

FIGURES_JS = """
const out = {};
document.querySelectorAll('[data-figure]').forEach(
  td => { out[td.dataset.figure] = td.textContent.replace(/,/g, ''); });
return out;"""


def _charts(driver: Any) -> dict[str, tuple[int, int, int]]:
    return {c[0]: (c[1], c[2], c[3]) for c in driver.execute_script(CHARTS_JS, SERIES_RGB)}


def _figures(driver: Any) -> dict[str, int | None]:
    shown = driver.execute_script(FIGURES_JS)
    return {k: (None if v == "–" else int(v)) for k, v in shown.items()}


def _screenshot(driver: Any, name: str, tmp_path: Path) -> Path:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(int(height) + 40, 8000))
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    driver.save_screenshot(str(path))
    shutil.copy(path, SHOTS / name)
    print(f"screenshot: {path} (copy: {SHOTS / name})")
    return path


def test_the_live_page_in_chromium_shows_what_status_json_says(
        watched_run: WatchedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet, live = watched_run.fleet, watched_run.live
    driver = _driver(AUTH)
    try:
        driver.get(live.url)

        def busy() -> bool:
            # Mid-run, while both GPUs work: the screenshot docs/report.md shows.
            shown = _figures(driver)
            updates = driver.execute_script("return Number(document.body.dataset.updates || 0)")
            return updates >= 4 and (shown.get("in_flight") or 0) > 0 and \
                (shown.get("done") or 0) > 20
        if watched_run.thread.is_alive():
            wait_until(lambda: busy() or not watched_run.thread.is_alive(), 120,
                       "the live page to show the run at work", poll_s=0.2)
        _screenshot(driver, "live.png", tmp_path)
        charts = _charts(driver)
        assert set(charts) == LIVE_CHARTS
        for chart, (width, height, ink) in charts.items():
            assert width > 300 and height > 200 and ink > 20, (chart, width, height, ink)

        watched_run.finished()
        capsys.readouterr()
        assert main(["status", "--run", RUN, "--json", "--redis", fleet.redis_url]) == 0
        said = orjson.loads(capsys.readouterr().out)
        # What no longer moves once the run is done (queue and in flight settle at 0).
        names = ("total", "read", "done", "failed", "rejected", "truncated", "retries",
                 "written", "prompt_tokens", "completion_tokens", "queued", "in_flight")
        expected = {name: said[name] for name in names}
        shown: dict[str, int | None] = {}

        def settled() -> bool:
            nonlocal shown
            shown = _figures(driver)
            return shown == expected

        wait_until(settled, 30, f"the live page to show {expected}", poll_s=0.2)
        shares = driver.execute_script("""const o = {}; document.querySelectorAll('[data-share]')
            .forEach(td => { o[td.dataset.share] = td.textContent; }); return o;""")
        assert shares == {k: f"{100 * v:.1f} %" for k, v in said["shares"].items()}
        workers = driver.find_element("id", "workers").text
        assert len(said["workers"]) == 2 and all(w["name"] in workers for w in said["workers"])
        _screenshot(driver, "live-finished.png", tmp_path)
        assert console_errors(driver) == []
    finally:
        driver.quit()
    # Without the login the same page is refused: the browser's own record of the answer.
    plain = _driver()
    try:
        plain.get(live.url)
        assert "fleetgenLive" not in plain.page_source
        assert statuses(plain, live.url) == [401]
    finally:
        plain.quit()


def test_the_report_in_chromium_draws_every_chart_and_shows_summary_json(
        watched_run: WatchedRun, tmp_path: Path) -> None:
    summary, out = watched_run.finished(), watched_run.out
    assert summary["truncated"] > 0 and summary["rejected"] == 5
    built = build(out)
    on_disk = orjson.loads((out / "summary.json").read_bytes())
    driver = _driver()
    try:
        driver.get(built.out.as_uri())
        wait_until(lambda: driver.execute_script("return document.body.dataset.ready") == "1",
                   20, "the report to render")
        charts = _charts(driver)
        assert set(charts) == REPORT_CHARTS
        for chart, (width, height, ink) in charts.items():
            assert width > 300 and height > 200 and ink > 50, (chart, width, height, ink)
        shown = _figures(driver)
        # Held-out requests are an outcome of their own (issue 51: counted everywhere).
        names = ("total", "done", "failed", "rejected", "holdout", "truncated",
                 "prompt_tokens", "completion_tokens", "empty", "reasoning_unfinished",
                 "json_invalid")
        assert shown == {name: on_disk.get(name, 0) for name in names}
        assert driver.find_element("id", "state").text == "complete"
        assert not driver.find_elements("id", "mismatch")
        rejections = driver.find_element("id", "rejections").text
        assert "prompt_too_long" in rejections and "invalid_json" in rejections
        shot = _screenshot(driver, "report.png", tmp_path)
        assert shot.stat().st_size > 20_000
        assert console_errors(driver) == []
    finally:
        driver.quit()
