"""Bad input never stops a run, and a user mistake is one line with a meaningful exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetgen import exitcodes
from fleetgen.local.fleet import LocalFleet
from tests.support.content import assert_fleet_content
from tests.support.pipeline import assert_exactly_once, read_output, run_pipeline


def test_every_kind_of_bad_row_is_rejected_with_its_line_and_the_run_goes_on(
        fleet4: LocalFleet, tmp_path: Path, out_dir: Path) -> None:
    big = orjson.dumps({"id": "huge", "messages": [{"role": "user",
                                                    "content": "x" * 50_000_000}]})
    lines: list[bytes] = [
        b'{"id": "ok1", "prompt": "hello"}',
        b'{"id": "j", "messages": [',  # 2 invalid JSON
        b'{"id": "m"}',  # 3 no messages
        b'{"id": "e", "messages": []}',  # 4 empty messages
        b'{"id": "t", "messages": [{"role": "user", "content": 42}]}',  # 5 wrong type
        b'{"id": "u", "prompt": "\xff\xfe bad"}',  # 6 invalid UTF-8
        b'{"id": "ok1", "prompt": "again"}',  # 7 duplicate id
        big,  # 8 a 50 MB line
        b'{"id": "img", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
        b'{"id": "ok2", "messages": [{"role": "user", "content": "hi"}]}',
    ]
    prompts = tmp_path / "bad.jsonl"
    prompts.write_bytes(b"\n".join(lines) + b"\n")
    summary = run_pipeline(fleet4, prompts, "bad-input", out_dir)
    data = read_output(out_dir)
    assert summary["complete"] and summary["total"] == 10 and summary["input_rows"] == 10
    assert {r["id"] for r in data["results"]} == {"ok1", "ok2"}
    assert assert_fleet_content(fleet4, prompts, data) == 2  # ok1 answers line 1's prompt
    reasons = {r["line"]: r["reason"].split(":")[0] for r in data["rejected"]}
    assert reasons == {2: "invalid_json", 3: "no_prompt", 4: "empty_messages",
                       5: "bad_messages", 6: "invalid_utf8", 7: "duplicate_id",
                       8: "prompt_too_long", 9: "bad_messages"}
    # A bad line's rejection shows where it breaks, not only its number.
    broken = next(r for r in data["rejected"] if r["line"] == 2)
    assert broken["reason"].endswith('; near: {"id": "j", "messages": ['), broken
    ok1 = next(r for r in data["results"] if r["id"] == "ok1")
    assert ok1["line"] == 1  # the first occurrence of a duplicated id wins ...
    dup = next(r for r in data["rejected"] if r["line"] == 7)
    assert dup["id"] == "ok1#7" and dup["duplicate_of"] == "ok1"  # ... and no id is written twice
    assert_exactly_once(out_dir, {"ok1", "ok2", "j", "m", "e", "t", "u", "ok1#7", "huge",
                                  "img"} - {"j", "u"} | {r["id"] for r in data["rejected"]
                                                         if r["line"] in (2, 6)})


def test_empty_file_completes_with_nothing(fleet4: LocalFleet, tmp_path: Path,
                                           out_dir: Path) -> None:
    prompts = tmp_path / "empty.jsonl"
    prompts.write_bytes(b"")
    summary = run_pipeline(fleet4, prompts, "empty", out_dir)
    assert summary["total"] == 0 and summary["complete"]
    assert_exactly_once(out_dir, set())


def fleetgen(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture()
def wrong_columns(tmp_path: Path) -> Path:
    path = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"question": ["what?"]}), path)
    return path


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["produce", "{tmp}/missing.jsonl", "--run", "r", "--context-length", "8192"],
     exitcodes.CONFIG, "input file not found"),
    (["produce", "{cols}", "--run", "r", "--context-length", "8192"], exitcodes.CONFIG,
     "none of the columns"),
    (["produce", "{prompts}", "--run", "r"], exitcodes.CONFIG, "--context-length"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8"], exitcodes.CONFIG,
     "at least 16"),
    (["produce", "{prompts}", "--run", "a b", "--context-length", "8192"], exitcodes.CONFIG,
     "--run"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192", "--tokenizer",
      "{tmp}/no-such-tokenizer"], exitcodes.CONFIG, "tokenizer"),
    (["produce", "{prompts}", "--run", "r", "--engine-url", "http://127.0.0.1:9"],
     exitcodes.UNAVAILABLE, "cannot read limits"),
    (["status", "--run", "nope"], exitcodes.CONFIG, "no run named"),
    (["drain", "--run", "r", "--out", "{tmp}/o", "--redis", "redis://127.0.0.1:9/0"],
     exitcodes.UNAVAILABLE, "cannot reach Redis"),
    (["status", "--redis", "http://nope"], exitcodes.CONFIG, "--redis must be"),
    (["produce", "{prompts}", "--context-length", "x"], exitcodes.USAGE, "usage"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192", "--n", "0"],
     exitcodes.CONFIG, "--n must be in 1..128"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192", "--logprobs", "21"],
     exitcodes.CONFIG, "--logprobs must be in 0..20"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192",
      "--chat-template-kwargs", "{{enable_thinking: no}}"], exitcodes.CONFIG,
     "--chat-template-kwargs is not JSON"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192",
      "--chat-template-kwargs", "[1]"], exitcodes.CONFIG, "must be a JSON object"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192", "--json-schema",
      "{tmp}/no-schema.json"], exitcodes.CONFIG, "--json-schema: cannot read"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192", "--after", "0"],
     exitcodes.CONFIG, "--after must be at least 1"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192", "--stop", ""],
     exitcodes.CONFIG, "--stop: an empty stop string would end every answer"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192",
      *(f"--stop=s{i}" for i in range(33))], exitcodes.CONFIG, "--stop: at most 32"),
    (["produce", "{prompts}", "--run", "r", "--context-length", "8192", "--reasoning",
      "maybe"], exitcodes.USAGE, "usage"),
])
def test_user_mistakes_get_one_line_and_an_exit_code(fleet4: LocalFleet, tmp_path: Path,
                                                     wrong_columns: Path, args: list[str],
                                                     code: int, needle: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    filled = [a.format(tmp=tmp_path, cols=wrong_columns, prompts=prompts) for a in args]
    done = fleetgen(*filled, env={"FLEETGEN_REDIS_URL": fleet4.redis_url})
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert needle in done.stderr
    if code != exitcodes.USAGE:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
