"""The report in headless Chromium, on an output directory written by hand (no fleet): the
answer-length axis fits the answers, with a budget far above them named at the axis's edge,
and a few answers can be read on the page (no `head results.jsonl` needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgen.monitor.report import build
from tests.support.browser import chromium, console_errors, require_chromium
from tests.support.waiting import wait_until

CAP = 8161  # the budget of the run: every answer far below it


def write_dir(out: Path, answers: list[int]) -> Path:
    out.mkdir(parents=True)
    (out / ".fleetgen-run").write_text("hand\n")
    results = [{"id": f"r{i}", "line": i, "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": f"Question number {i}?"}],
                "completion": f"Answer number {i}. " + "word " * tokens,
                "finish_reason": "length" if i == 5 else "stop", "prompt_tokens": 20,
                "completion_tokens": tokens, "max_tokens": CAP, "worker": "gpu0@h",
                "finished_at": 1000.0 + i}
               for i, tokens in enumerate(answers, start=1)]
    (out / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in results))
    for name in ("failures", "rejected"):
        (out / f"{name}.jsonl").write_bytes(b"")
    summary = {"run": "hand", "total": len(results), "done": len(results), "failed": 0,
               "rejected": 0, "truncated": 1, "prompt_tokens": 20 * len(results),
               "completion_tokens": sum(answers), "empty": 0, "reasoning_unfinished": 0,
               "json_invalid": 0, "complete": True,
               "settings": {"max_output_tokens": CAP, "context_length": 8192}}
    (out / "summary.json").write_bytes(orjson.dumps(summary))
    return out


@pytest.fixture()
def page(tmp_path: Path) -> Iterator[Any]:
    require_chromium()
    answers = [120, 340, 95, 800, 410, 230, 1500, 60, 275, 510]
    built = build(write_dir(tmp_path / "out", answers))
    driver = chromium()
    try:
        driver.get(built.out.as_uri())
        wait_until(lambda: driver.execute_script("return document.body.dataset.ready") == "1",
                   20, "the report to render")
        yield driver
        assert console_errors(driver) == []
    finally:
        driver.quit()


# Where the answers' bars reach across the chart: the rightmost column of the canvas drawn in
# the first series' colour (page.js COLORS[0], opaque on its stroke), as a share of its width.
REACH_JS = """
const canvas = document.querySelector('#chart-completion canvas');
const img = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
let right = 0;
for (let i = 0; i < img.length; i += 4)
  if (Math.abs(img[i] - 0x25) < 8 && Math.abs(img[i + 1] - 0x63) < 8 &&
      Math.abs(img[i + 2] - 0xEB) < 8 && img[i + 3] > 200)
    right = Math.max(right, (i / 4) % canvas.width);
return right / canvas.width;"""


def test_the_answer_axis_fits_the_answers_and_names_the_budget(page: Any) -> None:
    # The bars span the chart (before: the axis ran to the budget, all in its left fifth).
    assert page.execute_script(REACH_JS) > 0.75
    box = page.find_element("id", "chart-completion")
    xmax = float(box.get_attribute("data-xmax"))
    # The longest answer is 1,500 tokens: the axis ends at its bin, not at the 8,161 budget.
    assert 1500 <= xmax <= 1700, xmax
    assert f"cap {CAP}" in box.get_attribute("data-off-axis").splitlines()


def test_a_few_answers_can_be_read_on_the_page(page: Any) -> None:
    samples = page.find_element("id", "samples")
    rows = samples.find_elements("css selector", "tbody tr")
    ids = [r.find_elements("css selector", "td")[0].text for r in rows]
    assert ids == ["r1", "r2", "r3", "r5"]  # the first three, and the first cut at its budget
    first = rows[0].text
    assert "Question number 1?" in first and "Answer number 1." in first
    assert "Be brief." not in first  # the question asked, not the system prompt


def test_the_acceptance_section_shows_pooled_breakdowns_and_lowest_rows(
        tmp_path: Path) -> None:
    require_chromium()
    out = write_dir(tmp_path / "out", [100, 200, 300, 400, 500, 600])
    lines = []
    for i, raw in enumerate((out / "results.jsonl").read_bytes().splitlines()):
        record = orjson.loads(raw)
        record.update(source="ab"[i % 2], spec={"verify_ct": 40 + 10 * i})
        lines.append(orjson.dumps(record) + b"\n")
    (out / "results.jsonl").write_bytes(b"".join(lines))
    built = build(out, group_by="source")
    driver = chromium()
    try:
        driver.get(built.out.as_uri())
        wait_until(lambda: driver.execute_script("return document.body.dataset.ready") == "1",
                   20, "the report to render")
        pooled = driver.find_element("id", "spec").find_elements("css selector", "td")
        assert pooled[1].text == f"{2100 / 390:.3f}"  # Σ tokens / Σ steps
        groups = [r.find_elements("css selector", "td")[0].text for r in driver.find_element(
            "id", "spec-field-source").find_elements("css selector", "tbody tr")]
        assert sorted(groups) == ["a", "b"]
        lowest = driver.find_element("id", "spec-lowest-rows")
        assert len(lowest.find_elements("css selector", "tbody tr")) == 6
        assert console_errors(driver) == []
    finally:
        driver.quit()
    assert built.weak is not None and len(built.weak.read_bytes().splitlines()) == 6
