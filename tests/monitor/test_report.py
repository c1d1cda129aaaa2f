"""`fleetgen report` without a browser: what the streaming pass counts, against summary.json and
against a directory written by hand (superseded failures, a torn tail, old records without a
write time), the binning, the self-contained page, and the command's exit codes."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgen.cli.main import main
from fleetgen.errors import PermanentError
from fleetgen.monitor.report import (
    EXAMPLES,
    FIGURES,
    _nice,
    build,
    histogram,
    page_data,
    read_dir,
    throughput,
)
from fleetgen.queue.contract import TaskPayload
from fleetgen.records.outcomes import Generation, failure_record, result_record
from tools.report_bench import write_synthetic


def write_dir(out: Path, results: list[dict[str, Any]], failures: list[dict[str, Any]] = (),
              rejected: list[dict[str, Any]] = (), summary: dict[str, Any] | None = None
              ) -> Path:
    out.mkdir(parents=True)
    (out / ".fleetgen-run").write_text("hand\n")
    for name, records in (("results", results), ("failures", failures),
                          ("rejected", rejected)):
        (out / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    if summary is not None:
        (out / "summary.json").write_bytes(orjson.dumps(summary))
    return out


def res(line: int, tokens: int, *, finish: str = "stop", worker: str = "gpu0@h",
        at: float | None = 1000.5, **extra: Any) -> dict[str, Any]:
    record = {"id": f"r{line}", "completion": "x" * tokens, "finish_reason": finish,
              "prompt_tokens": 10 + line, "completion_tokens": tokens, "max_tokens": 100,
              "worker": worker, "line": line, **extra}
    if at is not None:
        record["finished_at"] = at
    return record


def test_the_streaming_pass_counts_what_the_drainer_summarised(tmp_path: Path) -> None:
    summary = write_synthetic(tmp_path / "out", 3000)
    read = read_dir(tmp_path / "out")
    data = page_data(read)
    assert data["figures"] == {name: summary[name] for name in FIGURES}
    assert data["mismatch"] == [] and data["complete"] is True
    assert summary["failed"] and summary["rejected"] and summary["reasoning_unfinished"]
    assert sum(data["completion"]["y"][0]) == summary["done"]
    assert sum(data["completion"]["y"][1]) == summary["truncated"] == data["finish"]["length"]
    assert sum(data["prompt"]["y"][0]) == summary["done"] + summary["failed"]
    assert sum(data["prompt"]["y"][1]) + data["prompt_rejected_without_length"] == \
        summary["rejected"]
    assert sum(w["done"] for w in data["workers"]) == summary["done"]
    assert sum(w["completion_tokens"] for w in data["workers"]) == summary["completion_tokens"]
    tp = data["throughput"]
    assert sum(tp["rows"]) == summary["done"] + summary["failed"]
    assert tp["rows_per_s"][0] == round(tp["rows"][0] / tp["width_s"], 3)
    assert sum(r["count"] for r in data["rejections"]) == summary["rejected"]
    assert all(len(r["examples"]) <= EXAMPLES for r in data["rejections"] + data["failures"])
    assert data["context"] == 8192


def test_a_failure_a_retry_turned_into_a_result_is_counted_once(tmp_path: Path) -> None:
    failure = {"id": "r2", "error": {"type": "retryable", "message": "boom", "status": 503},
               "attempts": 5, "max_tokens": 100, "prompt_tokens": 12, "worker": "gpu1@h",
               "line": 2}
    real = {**failure, "id": "r3", "line": 3, "error": {"type": "permanent",
                                                      "message": "no", "status": 400}}
    out = write_dir(tmp_path / "out", [res(1, 5), res(2, 7)], [failure, real])
    data = page_data(read_dir(out))
    assert (data["figures"]["done"], data["figures"]["failed"], data["superseded"]) == (2, 1, 1)
    assert [f["type"] for f in data["failures"]] == ["permanent"]
    assert data["failures"][0]["status"] == {"400": 1}
    # No summary.json: the total is what the files hold, and nothing is called complete.
    assert data["figures"]["total"] == 3 and data["complete"] is False


def test_a_torn_tail_is_left_out_and_named(tmp_path: Path) -> None:
    out = write_dir(tmp_path / "out", [res(1, 5), res(2, 9)])
    torn = b'{"id": "r3", "completion": "hal'
    with (out / "results.jsonl").open("ab") as f:
        f.write(torn)
    read = read_dir(out)
    assert read.scan.counts["done"] == 2 and read.torn == {"results.jsonl": len(torn)}


def test_old_records_without_a_write_time_draw_no_throughput(tmp_path: Path) -> None:
    out = write_dir(tmp_path / "out", [res(1, 5, at=None)])
    assert page_data(read_dir(out))["throughput"] is None


def test_summary_json_that_disagrees_with_the_files_is_named(tmp_path: Path) -> None:
    out = write_dir(tmp_path / "out", [res(1, 5), res(2, 6, finish="length")],
                    summary={"total": 2, "done": 1, "complete": True})
    data = page_data(read_dir(out))
    assert data["figures"]["done"] == 2 and data["figures"]["truncated"] == 1
    assert "done" in data["mismatch"] and "truncated" in data["mismatch"]


def test_a_damaged_line_inside_a_file_is_refused(tmp_path: Path) -> None:
    out = write_dir(tmp_path / "out", [res(1, 5)])
    (out / "results.jsonl").write_bytes(b"not json\n" + orjson.dumps(res(2, 1)) + b"\n")
    assert main(["report", str(out)]) == 3


def test_histogram_bins_share_one_round_width() -> None:
    h = histogram(Counter({0: 2, 7: 1, 119: 3}), Counter({119: 1, 250: 4}), bins=10)
    assert h["width"] == 50 and h["x"] == [0, 50, 100, 150, 200, 250]
    assert h["y"] == [[3, 0, 3, 0, 0, 0], [0, 0, 1, 0, 0, 4]]
    assert [_nice(x) for x in (0.3, 1, 1.2, 3, 7, 12, 4100 / 60)] == [1, 1, 2, 5, 10, 20, 100]
    assert histogram(Counter())["x"] == [0]


def test_throughput_buckets_cover_the_run() -> None:
    rows = Counter({100: 2, 101: 1, 1099: 4})
    tp = throughput(rows, Counter({100: 50, 1099: 40}))
    assert tp is not None and tp["width_s"] == 5 and tp["x"][0] == 100
    assert sum(tp["rows"]) == 7 and round(sum(tp["tokens_per_s"]) * 5) == 90
    assert throughput(Counter(), Counter()) is None


def test_worker_records_carry_their_write_time() -> None:
    payload = TaskPayload(run="r", line=1, id="a", input_ids=[1, 2], max_tokens=9,
                          sampling={}, row={})
    gen = Generation("hi", "stop", 2, 1, 0, 0.1)
    ok = result_record(payload, gen, max_tokens=9, attempts=1, worker="w")
    failed = failure_record(payload, PermanentError("no", 400), max_tokens=9, attempts=1,
                            worker="w")
    assert isinstance(ok["finished_at"], float) and isinstance(failed["finished_at"], float)


def test_the_page_is_one_file_that_loads_nothing(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    summary = write_synthetic(tmp_path / "out", 500)
    assert main(["report", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert page.count("<link") == 1 and '<link rel="icon" href="data:,">' in page
    assert "@import" not in page
    assert "uPlot" in page and "MIT" in page
    # User data cannot close the script element it is embedded in.
    assert page.count("</script>") == 3
    assert f"{summary['done']} results" in capsys.readouterr().out


def test_user_text_cannot_break_out_of_the_page(tmp_path: Path) -> None:
    evil = "</script><script>alert(1)</script>"
    out = write_dir(tmp_path / "out", [res(1, 5)],
                    rejected=[{"id": evil, "reason": f"invalid_json: {evil}", "line": 2}])
    built = build(out)
    page = built.out.read_text()
    assert evil not in page and page.count("</script>") == 3


def test_the_command_says_what_is_wrong(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nowhere")]) == 3
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    assert main(["report", str(tmp_path / "plain")]) == 3
    assert "not a drained output directory" in capsys.readouterr().err
    out = write_dir(tmp_path / "out", [res(1, 5)])
    assert main(["report", str(out), "--out", str(out / "results.jsonl")]) == 3
    assert (out / "results.jsonl").read_bytes().count(b"\n") == 1
    # Written, but the run is not complete (no summary.json): exit 1, said on stderr.
    assert main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 1
    assert (tmp_path / "r.html").exists() and "not complete" in capsys.readouterr().err


def test_held_out_rows_are_counted_as_requests_and_rows(tmp_path: Path) -> None:
    """The outcome table showed `total 460, done 389, failed 0, rejected 8`: 63 held-out
    requests unaccounted for. A holdout line stands for every request of its row."""
    out = write_dir(tmp_path / "out", [res(0, 5), res(1, 7)],
                    summary={"total": 8, "done": 2, "failed": 0, "rejected": 0, "holdout": 6})
    held = [{"id": "h2", "line": 2, "slot": 2, "slots": 4, "prompt": "a"},
            {"id": "h3", "line": 3, "slot": 6, "slots": 2, "prompt": "b"}]
    (out / "holdout.jsonl").write_bytes(b"".join(orjson.dumps(h) + b"\n" for h in held))
    data = page_data(read_dir(out))
    f = data["figures"]
    assert (f["total"], f["done"], f["holdout"], data["holdout_rows"]) == (8, 2, 6, 2)
    assert f["total"] == f["done"] + f["failed"] + f["rejected"] + f["holdout"]
    assert "holdout" not in data["mismatch"]
