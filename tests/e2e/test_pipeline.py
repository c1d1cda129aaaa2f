"""The whole pipeline on real parts: Valkey, Celery workers, simulated SGLang over HTTP, files."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import redis

from fleetgen.local.fleet import LocalFleet
from fleetgen.runstate.keys import RunKeys
from producer.tokenizer import load_tokenizer
from tests.support.content import assert_fleet_content
from tests.support.pipeline import (
    assert_exactly_once,
    make_prompts,
    produce,
    read_output,
    run_pipeline,
)
from tests.support.waiting import wait_until

CTX = 8192


def test_500_prompts_on_4_gpus_every_row_exactly_once(fleet4: LocalFleet, tmp_path: Path,
                                                      out_dir: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 500, too_long=5, malformed=5)
    summary = run_pipeline(fleet4, prompts, "e2e-500", out_dir, max_output_tokens=8192)

    rejected_bad = {r["id"] for r in read_output(out_dir)["rejected"]
                    if r["reason"].startswith("invalid_json")}
    assert len(rejected_bad) == 5  # a line that is not JSON gets an id derived from its bytes
    expected = set(kinds["good"]) | set(kinds["too_long"]) | rejected_bad
    data = assert_exactly_once(out_dir, expected)
    assert summary["complete"] and summary["total"] == 510
    assert summary["done"] == 500 and summary["rejected"] == 10 and summary["failed"] == 0
    assert not data["failures"], data["failures"][:3]
    assert assert_fleet_content(fleet4, prompts, data) == 500

    results = {r["id"]: r for r in data["results"]}
    for r in results.values():
        assert r["prompt_tokens"] + r["max_tokens"] < CTX
        assert r["finish_reason"] in ("stop", "length")
        assert r["k"] == int(r["id"][1:])  # carried-through field
    workers = {r["worker"].split("@")[0] for r in results.values()}
    assert workers == {"gpu0", "gpu1", "gpu2", "gpu3"}, workers

    # The prompt_tokens the server saw equal our own count of the rendered prompt.
    tok = load_tokenizer("qwen3.6")
    sample = sorted(results.values(), key=lambda r: r["id"])[:100]
    counts = tok.encode_batch([tok.render(r["messages"]) for r in sample])
    assert [r["prompt_tokens"] for r in sample] == [len(c) for c in counts]

    rejected = {r["id"]: r for r in data["rejected"]}
    for i in kinds["too_long"]:
        assert rejected[i]["reason"].startswith("prompt_too_long")
        assert rejected[i]["prompt_tokens"] > CTX
    bad_lines = sorted(r["line"] for r in data["rejected"] if r["id"] in rejected_bad)
    source = prompts.read_bytes().splitlines()
    assert all(source[n - 1].startswith(b'{"id": "bad') for n in bad_lines)


def test_seed_scenario_context_8192_cap_8192_no_400(fleet4: LocalFleet, tmp_path: Path,
                                                    out_dir: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 60, seed=11)
    # The seed's script: max_new_tokens=8192 with every prompt. Every request is refused.
    tok = load_tokenizer("qwen3.6")
    rows = [orjson.loads(line) for line in prompts.read_bytes().splitlines()]
    ids = tok.encode_batch([tok.render(r["messages"]) for r in rows[:20]])
    statuses = []
    with httpx.Client(base_url=fleet4.engine_url(0), timeout=30) as http:
        for input_ids in ids:
            response = http.post("/generate", json={
                "input_ids": input_ids, "sampling_params": {"max_new_tokens": 8192}})
            statuses.append(response.status_code)
            assert "maximum context length of 8192 tokens" in response.json()["error"]["message"]
    assert statuses == [400] * 20

    # fleetgen with the same cap: exact budgets, no 400, nothing truncated by the cap.
    summary = run_pipeline(fleet4, prompts, "seed-8192", out_dir, max_output_tokens=8192)
    data = assert_exactly_once(out_dir, set(kinds["good"]))
    assert summary["failed"] == 0 and summary["done"] == 60
    assert all(r["max_tokens"] == CTX - r["prompt_tokens"] - 2 for r in data["results"])
    assert assert_fleet_content(fleet4, prompts, data) == 60


def test_follow_drainer_keeps_summary_current(fleet4: LocalFleet, tmp_path: Path,
                                              out_dir: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 80, seed=5)
    drainer = subprocess.Popen([sys.executable, "-m", "fleetgen", "drain", "--run", "follow",
                                "--out", str(out_dir), "--follow", "--redis", fleet4.redis_url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        produce(fleet4, prompts, "follow")
        summary = out_dir / "summary.json"

        def complete() -> bool:
            return summary.exists() and orjson.loads(summary.read_bytes())["complete"]

        wait_until(complete, 60, "the --follow drainer to report the run complete")
        assert drainer.poll() is None  # still following
    finally:
        drainer.send_signal(signal.SIGTERM)
        assert drainer.wait(timeout=30) == 0
    data = assert_exactly_once(out_dir, set(kinds["good"]))
    assert assert_fleet_content(fleet4, prompts, data) == 80


def test_purge_removes_a_finished_runs_keys_only(fleet4: LocalFleet, tmp_path: Path,
                                                 out_dir: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    make_prompts(prompts, 30, seed=9)
    client = redis.Redis.from_url(fleet4.redis_url)
    client.hset(RunKeys("unfinished").manifest, mapping={"state": "producing"})
    run_pipeline(fleet4, prompts, "purged", out_dir)

    def purge(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleetgen", "purge", *args, "--redis",
                               fleet4.redis_url], capture_output=True, text=True, timeout=60)

    refused = purge("--run", "unfinished")
    assert refused.returncode == 3 and "not complete" in refused.stderr
    done = purge("--run", "purged")
    assert done.returncode == 0, done.stderr
    assert not [k for k in client.scan_iter("fleetgen:run:purged:*")]
    assert client.exists(RunKeys("unfinished").manifest)
    assert assert_fleet_content(fleet4, prompts, read_output(out_dir)) == 30  # untouched
    assert purge("--run", "unfinished", "--force").returncode == 0
    assert purge("--run", "purged").returncode == 3  # gone
