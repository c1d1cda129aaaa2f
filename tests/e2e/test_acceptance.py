"""`fleetgen run --measure-acceptance` as a user runs it, against three `fleetgen sim` servers
whose drafters differ (`--spec-accept-rate`): every result carries `spec`, summary.json's pooled
figure is Σ completion tokens / Σ verify steps of the results, the by-server order is the
servers' rates, the report's breakdowns are the files' and weak.jsonl holds the lowest rows as
input rows; a fleet that does not speculate is refused in one line."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgen import exitcodes
from fleetgen.local.simgpus import SimGpus
from tests.support.cli import fleetgen_cli
from tests.support.sims import engine_flags, separate_sims

# Rates in an order that is not the URLs' own, so the by-server order proves the mapping.
RATES = (0.55, 0.85, 0.25)
SOURCES = ("code", "chat", "math")
ROWS = 120
SIMS = SimGpus(gpus=1, context_length=4096, max_running_requests=16, tpot_ms=1.0,
               output_tokens_mean=120)


@contextmanager
def sim(tmp_path: Path, name: str, extra: list[str]) -> Iterator[str]:
    """One `fleetgen sim` server in a process of its own, as a user starts it."""
    with separate_sims(tmp_path, SIMS, *extra, name=name, count=1) as urls:
        yield urls[0]


def write_prompts(path: Path) -> None:
    lines = []
    for i in range(ROWS):
        row: dict[str, Any] = {"id": f"q{i}", "source": SOURCES[i % 3],
               "messages": [{"role": "user", "content": f"question {i} " + "word " * (i % 40)}]}
        if i % 4 == 0:
            row["chat_template_kwargs"] = {"enable_thinking": False}
        lines.append(orjson.dumps(row))
    path.write_bytes(b"\n".join(lines) + b"\n")


def pooled(records: list[dict[str, Any]]) -> float:
    return sum(r["completion_tokens"] for r in records) / sum(
        r["spec"]["verify_ct"] for r in records)


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[list[str]]:
    with sim(tmp_path, "a", spec_args(RATES[0])) as a, \
            sim(tmp_path, "b", spec_args(RATES[1])) as b, \
            sim(tmp_path, "c", spec_args(RATES[2])) as c:
        yield [a, b, c]


def spec_args(rate: float) -> list[str]:
    return ["--speculative-algorithm", "EAGLE3", "--spec-accept-rate", str(rate)]


def test_measure_acceptance_on_three_drafters(servers: list[str], tmp_path: Path) -> None:
    write_prompts(tmp_path / "holdout.jsonl")
    argv = fleetgen_cli("run", "holdout.jsonl", *engine_flags(servers),
                        "--out", "out/acceptance", "--measure-acceptance", "--group-by", "source")
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out" / "acceptance"
    results = [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]
    assert len(results) == ROWS
    assert all(isinstance(r.get("spec"), dict) and r["spec"]["verify_ct"] > 0 for r in results)

    summary = orjson.loads((out / "summary.json").read_bytes())
    spec = summary["spec"]
    assert spec["accept_length"] == round(pooled(results), 4)
    assert spec["requests"] == ROWS and spec["without_spec"] == 0
    mean = sum(r["spec"]["accept_length"] for r in results) / ROWS
    assert spec["accept_length_mean"] == round(mean, 4) and "pooled" in spec["note"]

    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        by_worker[r["worker"].split("@")[0]].append(r)
    assert {w: f["accept_length"] for w, f in spec["by_worker"].items()} == {
        f"{w}@{r[0]['worker'].split('@')[1]}": round(pooled(r), 4) for w, r in by_worker.items()}
    # gpuN is the N-th --engine-url: lowest rate, lowest figure.
    order = sorted(spec["by_worker"], key=lambda w: spec["by_worker"][w]["accept_length"])
    assert [int(w.split("@")[0][3:]) for w in order] == sorted(range(3), key=lambda i: RATES[i])

    # Three drafters: each breakdown is a server x group table, each cell its own Σ/Σ.
    report = orjson.loads(_report_data(out / "report.html"))["spec"]
    assert report["compared"].startswith("within each server")
    sources = {(g["server"], g["group"]): g["accept_length"]
               for g in report["breakdowns"]["field:source"]}
    assert sources == {(w, s): round(pooled(cell), 4) for w in {r["worker"] for r in results}
                       for s in SOURCES
                       if (cell := [r for r in results if r["source"] == s and r["worker"] == w])}
    thinking = defaultdict(int)
    for g in report["breakdowns"]["thinking"]:
        thinking[g["group"]] += g["requests"]
    assert thinking == {"off": ROWS // 4, "on": ROWS - ROWS // 4}

    # The lowest rows are each server's lowest, taken rank by rank across the servers.
    weak = [orjson.loads(line) for line in (out / "weak.jsonl").read_bytes().splitlines()]
    ranked = [sorted((r for r in results if r["worker"] == w),
                     key=lambda r: (r["spec"]["accept_length"], r["line"]))
              for w in sorted({r["worker"] for r in results})]
    lowest = [rows[rank] for rank in range(7) for rows in ranked][:20]
    assert [w["id"] for w in weak] == [r["id"] for r in lowest]
    assert all(set(w) <= {"id", "source", "messages", "chat_template_kwargs"} for w in weak)
    assert "acceptance: " in done.stdout and "tokens per verify step pooled" in done.stdout
    assert "by source within gpu0@" in done.stdout and "weak.jsonl" in done.stdout
    print(f"\npooled {spec['accept_length']} vs per-request mean {spec['accept_length_mean']};"
          f" by server {[spec['by_worker'][w]['accept_length'] for w in order]}")


def _report_data(page: Path) -> bytes:
    """The JSON the report page carries."""
    text = page.read_text()
    start = text.index('<script type="application/json" id="page-data">') + len(
        '<script type="application/json" id="page-data">')
    return text[start:text.index("</script>", start)].encode()


def test_servers_that_do_not_speculate_are_refused(tmp_path: Path) -> None:
    write_prompts(tmp_path / "holdout.jsonl")
    with sim(tmp_path, "plain", []) as url:
        done = subprocess.run(fleetgen_cli("run", "holdout.jsonl", "--engine-url", url,
                                           "--out", "out/plain", "--measure-acceptance"),
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == exitcodes.CONFIG, done.stdout + done.stderr
    assert "no --engine-url runs a speculative algorithm" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists(), "a refused run leaves no --out behind"


def test_a_server_that_does_not_speculate_is_named_and_its_answers_carry_no_spec(
        tmp_path: Path) -> None:
    write_prompts(tmp_path / "holdout.jsonl")
    with sim(tmp_path, "spec", spec_args(0.6)) as drafting, sim(tmp_path, "plain", []) as plain:
        done = subprocess.run(fleetgen_cli("run", "holdout.jsonl", "--engine-url", drafting,
                                           "--engine-url", plain, "--out", "out/mixed",
                                           "--measure-acceptance"),
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    warning = [line for line in done.stderr.splitlines() if "run no speculative" in line]
    assert len(warning) == 1 and plain in warning[0] and drafting not in warning[0], done.stderr
    results = [orjson.loads(line) for line in
               (tmp_path / "out/mixed/results.jsonl").read_bytes().splitlines()]
    assert len(results) == ROWS
    by_gpu = defaultdict(set)
    for r in results:
        by_gpu[r["worker"].split("@")[0]].add("spec" in r)
    # gpu0 is the first --engine-url (the drafting one), gpu1 the plain one.
    assert by_gpu == {"gpu0": {True}, "gpu1": {False}}, by_gpu


def test_vllm_servers_acceptance_from_their_counters(tmp_path: Path) -> None:
    """vLLM keeps acceptance only on /metrics: each worker writes the counters' growth into
    its results, and summary.json pools it per worker, in the servers' rate order."""
    write_prompts(tmp_path / "holdout.jsonl")
    rates = (0.8, 0.3)
    with sim(tmp_path, "v0", ["--flavor", "vllm", *spec_args(rates[0])]) as a, \
            sim(tmp_path, "v1", ["--flavor", "vllm", *spec_args(rates[1])]) as b:
        done = subprocess.run(fleetgen_cli("run", "holdout.jsonl", "--engine-url", a,
                                           "--engine-url", b, "--out", "out/vllm",
                                           "--measure-acceptance"),
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        served = [counters(url) for url in (a, b)]
    out = tmp_path / "out" / "vllm"
    results = [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]
    assert not any("spec" in r for r in results)  # no per-request figures from vLLM
    assert any("spec_counters" in r for r in results)
    vllm = orjson.loads((out / "summary.json").read_bytes())["spec"]["vllm"]
    figures = [vllm["by_worker"][w]["accept_length"] for w in sorted(vllm["by_worker"])]
    assert figures[0] > figures[1]  # gpu0 is the first --engine-url, the better drafter
    for written, (drafts, accepted) in zip(sorted(vllm["by_worker"]), served, strict=True):
        got = vllm["by_worker"][written]
        # The last answer in flight reads the counters afresh: all of the work is in them
        # (only the start-up probes' few drafts, sent before the baseline, are not: 3 here).
        assert 0 < got["drafts"] <= drafts and got["accepted"] <= accepted
        assert drafts - got["drafts"] <= 8, (got, drafts)
        assert abs(got["accept_length"] - (1 + accepted / drafts)) < 0.01
    assert "vLLM acceptance" in done.stdout
    # The user is told how to get each answer's own, before the run and after it.
    assert done.stderr.count("--per-request-spec-decode-metrics summary") == 1, done.stderr
    assert "no breakdown: start vLLM with --per-request-spec-decode-metrics" in done.stdout
    print(f"\nvLLM by worker {figures}; the servers' own "
          f"{[round(1 + acc / d, 4) for d, acc in served]}")


def test_vllm_servers_per_request_acceptance_is_each_rows_spec(tmp_path: Path) -> None:
    """vLLM started with --per-request-spec-decode-metrics summary: every result carries its
    own `spec`, no result the counters; the files' Σ verify steps and Σ accepted drafts are
    the servers' own counters, so the pooled figure is theirs; by source, a breakdown."""
    write_prompts(tmp_path / "holdout.jsonl")
    flags = ["--flavor", "vllm", "--per-request-spec-decode-metrics", "summary"]
    with sim(tmp_path, "v0", [*flags, *spec_args(0.8)]) as a, \
            sim(tmp_path, "v1", [*flags, *spec_args(0.3)]) as b:
        done = subprocess.run(fleetgen_cli("run", "holdout.jsonl", "--engine-url", a,
                                           "--engine-url", b, "--out", "out/vllm",
                                           "--measure-acceptance", "--group-by", "source"),
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        served = [counters(url) for url in (a, b)]
    out = tmp_path / "out" / "vllm"
    results = [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]
    assert all("spec" in r and "spec_counters" not in r for r in results)
    # The servers also answered the pre-flight's and --measure-acceptance's 2-token probes:
    # three a server, a verify step each at most.
    steps = sum(r["spec"]["verify_ct"] for r in results)
    accepted = sum(r["spec"]["correct_drafts"] for r in results)
    assert 0 <= sum(d for d, _ in served) - steps <= 2 * 3
    assert 0 <= sum(acc for _, acc in served) - accepted <= 2 * 3 * 3
    spec = orjson.loads((out / "summary.json").read_bytes())["spec"]
    assert "vllm" not in spec and spec["requests"] == len(results)
    assert spec["accept_length"] == round(1 + accepted / steps, 4)
    by_worker = [spec["by_worker"][w]["accept_length"] for w in sorted(spec["by_worker"])]
    assert by_worker[0] > by_worker[1]
    assert "by source" in done.stdout and "--per-request-spec-decode-metrics" not in \
        done.stdout + done.stderr


def counters(url: str) -> tuple[float, float]:
    """(drafts, accepted) on a vLLM server's /metrics."""
    from fleetgen.engine.speculation import read_vllm_counters

    read = read_vllm_counters(url)
    assert read is not None
    return read.drafts, read.accepted
