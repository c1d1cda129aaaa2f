"""Every input format end to end through the real CLI (`fleetgen produce` + `fleetgen drain`):
the same conversations written as `messages`, ShareGPT `conversations` (from/value and
role/content) and Parquet must give byte-identical answers; a `prompt` is sent as is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetgen.local.fleet import LocalFleet
from tests.e2e.content import assert_fleet_content, tokenizer
from tests.e2e.pipeline import assert_exactly_once

SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt"}


def conversations() -> list[dict[str, Any]]:
    """Rows with a system turn, several turns, a trailing answer (dropped: it is what we
    regenerate), unicode and code."""
    rows = []
    for i in range(12):
        turns = [{"role": "user", "content": f"Question {i}: what is {i} × 7? 数据 😀"}]
        if i % 3 == 0:
            turns.insert(0, {"role": "system", "content": f"You are terse (style {i})."})
        if i % 4 == 1:
            turns += [{"role": "assistant", "content": f"{i * 7}."},
                      {"role": "user", "content": "def f(x):\n    return x * 2\nExplain."}]
        if i % 5 == 2:
            turns.append({"role": "assistant", "content": "an old answer to regenerate"})
        rows.append({"id": f"c{i}", "turns": turns, "n": i})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def as_messages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": r["id"], "messages": r["turns"], "n": r["n"]} for r in rows]


def as_sharegpt(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": r["id"], "n": r["n"], "conversations": [
        {"from": SHAREGPT_FROM[t["role"]], "value": t["content"]} for t in r["turns"]]}
        for r in rows]


def as_role_conversations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": r["id"], "n": r["n"], "conversations": r["turns"]} for r in rows]


def fleetgen(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=180, env=dict(os.environ))
    assert done.returncode == 0, f"fleetgen {args[0]}: {done.stdout}{done.stderr}"
    return done


def run_cli(fleet: LocalFleet, prompts: Path, run: str, out: Path,
            *extra: str) -> dict[str, list[dict[str, Any]]]:
    fleetgen("produce", str(prompts), "--run", run, "--context-length", "8192",
             "--max-output-tokens", "512", "--redis", fleet.redis_url, *extra)
    fleetgen("drain", "--run", run, "--out", str(out), "--redis", fleet.redis_url)
    return assert_exactly_once(out, {f"c{i}" for i in range(12)} if run != "fmt-prompt"
                               else {f"q{i}" for i in range(12)})


ANSWER = ("completion", "completion_tokens", "finish_reason", "prompt_tokens", "max_tokens")


@pytest.fixture(scope="module")
def via_messages(fleet4: LocalFleet, tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("messages")
    prompts = write_jsonl(tmp / "messages.jsonl", as_messages(conversations()))
    data = run_cli(fleet4, prompts, "fmt-messages", tmp / "out")
    assert assert_fleet_content(fleet4, prompts, data) == 12
    # Independently of the producer's parsing: the template applied to the turns without the
    # trailing answer.
    tok = tokenizer()
    for row, result in zip(conversations(), sorted(data["results"], key=lambda r: r["n"]),
                           strict=True):
        turns = row["turns"][:-1] if row["turns"][-1]["role"] == "assistant" else row["turns"]
        assert result["prompt_tokens"] == tok.count(tok.render(turns)), row["id"]
    return {r["id"]: r for r in data["results"]}


@pytest.mark.parametrize("form", ["sharegpt", "role_content", "parquet"])
def test_each_format_gives_the_same_answers_as_messages(
        form: str, fleet4: LocalFleet, tmp_path: Path,
        via_messages: dict[str, dict[str, Any]]) -> None:
    rows = conversations()
    if form == "sharegpt":
        prompts = write_jsonl(tmp_path / "sharegpt.jsonl", as_sharegpt(rows))
    elif form == "role_content":
        prompts = write_jsonl(tmp_path / "roles.jsonl", as_role_conversations(rows))
    else:
        prompts = tmp_path / "rows.parquet"
        pq.write_table(pa.Table.from_pylist(as_messages(rows)), prompts)
    data = run_cli(fleet4, prompts, f"fmt-{form}", tmp_path / "out")
    assert assert_fleet_content(fleet4, prompts, data) == 12
    for result in data["results"]:
        want = via_messages[result["id"]]
        assert {k: result[k] for k in ANSWER} == {k: want[k] for k in ANSWER}, result["id"]
        assert result["n"] == want["n"]  # other fields carried through
    print(f"\n{form}: 12 rows, answers identical to the messages form")


def test_prompt_rows_are_sent_without_a_chat_template(fleet4: LocalFleet,
                                                      tmp_path: Path) -> None:
    texts = [f"Plain text {i}: continue this 数据 story" + " and then" * i for i in range(12)]
    prompts = write_jsonl(tmp_path / "prompt.jsonl",
                          [{"id": f"q{i}", "prompt": t} for i, t in enumerate(texts)])
    data = run_cli(fleet4, prompts, "fmt-prompt", tmp_path / "out", "--seed", "5")
    assert assert_fleet_content(fleet4, prompts, data, sampling={"seed": 5}) == 12
    tok = tokenizer()
    by_id = {r["id"]: r for r in data["results"]}
    for i, text in enumerate(texts):
        plain = tok.count(text)
        templated = tok.count(tok.render([{"role": "user", "content": text}]))
        assert by_id[f"q{i}"]["prompt_tokens"] == plain < templated
