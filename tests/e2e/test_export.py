"""A real run exported: producer, Celery workers and simulated GPUs (one server in four answers
500, and a worker tries once, so some rows fail), the drainer, then `fleetgen purge` and
`fleetgen export` in all three formats with the run's keys gone, each checked against what the
drainer wrote and what the input asked."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
import redis

from fleetgen.exporter import shape
from fleetgen.exporter.finished import unfinished
from fleetgen.local.fleet import LocalFleet
from tests.support.fleet import sim_fleet
from tests.support.pipeline import run_pipeline

SHAREGPT = {"system": "system", "user": "human", "assistant": "gpt"}


@pytest.fixture(scope="module")
def failing_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    fleet = sim_fleet(tmp_path_factory.mktemp("fleet-export"), gpus=2, context_length=8192,
                      max_running_requests=8, ttft_ms=2, tpot_ms=0.05, output_tokens_mean=40,
                      sim_args=["--error-rate", "0.25"],
                      worker_env={"FLEETGEN_MAX_ATTEMPTS": "1"})
    fleet.start()
    yield fleet
    fleet.stop()


def input_rows() -> list[bytes]:
    """40 rows in four shapes (some with a trailing answer to drop), then a row too long, a
    line that is not JSON and a repeated id."""
    rows: list[dict[str, Any]] = []
    for i in range(40):
        turns = [{"role": "user", "content": f"Question {i}: what is {i} x 3? 数据"}]
        if i % 3 == 0:
            turns.append({"role": "assistant", "content": "an old answer"})
        shape = i % 4
        if shape == 0:
            rows.append({"id": f"m{i}", "messages": turns, "k": i})
        elif shape == 1:
            rows.append({"id": f"s{i}", "conversations": [
                {"from": SHAREGPT[t["role"]], "value": t["content"]} for t in turns]})
        elif shape == 2:
            rows.append({"id": f"r{i}", "conversations": turns})
        else:
            rows.append({"id": f"p{i}", "prompt": f"Continue the story {i}:"})
    lines = [orjson.dumps(r) for r in rows]
    lines.append(orjson.dumps({"id": "long", "prompt": "lorem ipsum dolor " * 4000}))
    lines.append(b'{"id": "broken", "messages": [')
    lines.append(orjson.dumps({"id": "m0", "prompt": "again"}))
    return lines


def fleetgen(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=180, env=env)


def test_a_real_run_exports_after_its_keys_are_purged(failing_fleet: LocalFleet,
                                                      tmp_path: Path) -> None:
    lines = input_rows()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out"
    summary = run_pipeline(failing_fleet, prompts, "exported", out, max_output_tokens=64)
    assert summary["total"] == 43
    data = _drained(out)
    assert data["failures"], "the fault injection made no row fail: nothing to check"
    env = dict(os.environ, FLEETGEN_REDIS_URL=failing_fleet.redis_url)
    purged = fleetgen("purge", "--run", "exported", env=env)
    assert purged.returncode == 0, purged.stderr
    assert not list(redis.Redis.from_url(failing_fleet.redis_url).scan_iter(
        "fleetgen:run:exported:*"))
    for fmt in ("conversations", "openai-batch", "parquet"):
        done = fleetgen("export", str(out), "--format", fmt, env=env)
        assert done.returncode == 0, done.stderr
    rows = {n: orjson.loads(line) for n, line in enumerate(lines[:40], start=1)}
    _check_conversations(out, data["results"], rows)
    _check_openai_batch(out, data, len(lines))
    table = pq.read_table(out / "export.parquet").to_pylist()
    assert [(r["line"], r["completion"]) for r in table] == [
        (r["line"], r["completion"]) for r in data["results"]]


def _drained(out: Path) -> dict[str, list[dict[str, Any]]]:
    """The drainer's files, each sorted by input line."""
    data = {}
    for kind in ("results", "failures", "rejected"):
        raw = (out / f"{kind}.jsonl").read_bytes()
        data[kind] = sorted((orjson.loads(x) for x in raw.splitlines()),
                            key=lambda r: r["line"])
    return data


def _check_conversations(out: Path, results: list[dict[str, Any]],
                         rows: dict[int, Any]) -> None:
    """Every finished result as SpecForge's row (unfinished ones are left out by default):
    `conversations` of role/content turns whatever the input's shape (ShareGPT converted, the
    dataset's own earlier answers marked `generated: false`), status success; a raw prompt as
    `prompt` and `completion` with no conversation, so no trainer wraps it in a template."""
    exported = [orjson.loads(x) for x in
                (out / "export.conversations.jsonl").read_bytes().splitlines()]
    finished = [r for r in results if unfinished(r) is None]
    assert finished and len(exported) == len(finished)
    roles = {v: k for k, v in SHAREGPT.items()}
    for got, result in zip(exported, finished, strict=True):
        row = rows[result["line"]]
        assert got["id"] == result["id"] == row["id"]
        assert got["finish_reason"] == result["finish_reason"]
        assert got["status"] == "success" and "messages" not in got
        answer = {"role": "assistant", "content": result["completion"]}
        if isinstance(result.get("reasoning"), str):  # Qwen3.6 splits reasoning by default
            answer["reasoning_content"] = result["reasoning"]
        if "prompt" in row:
            assert got["conversations"] is None and got["prompt"] == row["prompt"]
            assert got["completion"] == result["completion"]
            continue
        turns = row["messages"] if "messages" in row else row["conversations"]
        asked = turns[:-1] if len(turns) > 1 else turns  # the old answer is dropped
        asked = [{"role": roles[t["from"]], "content": t["value"]} if "from" in t else t
                 for t in asked]
        assert got["conversations"] == [*asked, answer], row["id"]
        if "messages" in row:
            assert got["k"] == row["k"]


def _check_openai_batch(out: Path, data: dict[str, list[dict[str, Any]]],
                        total: int) -> None:
    exported = [orjson.loads(x) for x in
                (out / "export.openai-batch.jsonl").read_bytes().splitlines()]
    assert len(exported) == total  # one line per input line, in input order
    by_line: dict[int, tuple[str, dict[str, Any]]] = {
        r["line"]: (kind, r) for kind, records in data.items() for r in records}
    for line, got in enumerate(exported, start=1):
        kind, record = by_line[line]
        if kind == "results":
            body = got["response"]["body"]
            assert got["custom_id"] == record["id"] and got["error"] is None
            assert got["response"]["status_code"] == 200
            (choice,) = body["choices"]
            if "prompt" in record:
                # A completions choice has no reasoning field: kept, it stays in the text
                # (fleetgen/exporter/openai_batch.py `_text_choice`), as vLLM's completions text
                # has it.
                text, want = choice["text"], shape.answer(record, "inline")[0]
            else:
                text, want = choice["message"]["content"], record["completion"]
            assert text == want
            assert body["object"] == ("text_completion" if "prompt" in record
                                      else "chat.completion")
            usage = {"prompt_tokens": record["prompt_tokens"],
                     "completion_tokens": record["completion_tokens"],
                     "total_tokens": record["prompt_tokens"] + record["completion_tokens"]}
            if "reasoning_tokens" in record:  # Qwen3.6 splits reasoning by default
                usage["completion_tokens_details"] = {
                    "reasoning_tokens": record["reasoning_tokens"]}
            assert body["usage"] == usage
        elif kind == "failures":
            error = record["error"]
            assert got["error"] == {"code": error["type"], "message": error["message"]}
            assert got["response"] == (None if error["status"] is None else {
                "status_code": error["status"], "request_id": got["response"]["request_id"],
                "body": None})
        else:
            assert got["response"]["status_code"] == 400
            assert got["error"]["code"] == record["reason"].split(":")[0]
    codes = [g["error"]["code"] for g in exported[40:]]
    assert codes == ["prompt_too_long", "invalid_json", "duplicate_id"]
    assert exported[42]["custom_id"] == "m0"  # the id the duplicate line carried
