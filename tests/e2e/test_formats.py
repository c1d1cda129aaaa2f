"""Every input format end to end through the real CLI (`fleetgen produce` + `fleetgen drain`):
the same conversations written as `messages`, ShareGPT `conversations` (from/value and
role/content), Parquet, OpenAI Batch lines, gzip and zstd JSONL must give byte-identical
answers; a `prompt` is sent as is; a directory of files is one run."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from fleetgen import exitcodes
from fleetgen.local.fleet import LocalFleet
from producer.rows import derive_id
from tests.support.cli import fleetgen
from tests.support.content import assert_fleet_content, tokenizer
from tests.support.pipeline import assert_exactly_once, write_jsonl

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


def as_messages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": r["id"], "messages": r["turns"], "n": r["n"]} for r in rows]


def as_sharegpt(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": r["id"], "n": r["n"], "conversations": [
        {"from": SHAREGPT_FROM[t["role"]], "value": t["content"]} for t in r["turns"]]}
        for r in rows]


def as_role_conversations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": r["id"], "n": r["n"], "conversations": r["turns"]} for r in rows]


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


CHAT = "/v1/chat/completions"


def as_batch(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"custom_id": r["id"], "method": "POST", "url": CHAT,
             "body": {"model": "gpt-4o-mini", "messages": r["turns"]}} for r in rows]


def write_compressed(path: Path, rows: list[dict[str, Any]]) -> Path:
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz"
                     else zstandard.ZstdCompressor().compress(data))
    return path


def test_a_directory_of_gzip_zstd_batch_and_parquet_files_through_the_cli(
        fleet4: LocalFleet, tmp_path: Path, via_messages: dict[str, dict[str, Any]]) -> None:
    """Four files of four formats, read in name order as one run: every row answered as its
    messages form is, numbered across the files, and each bad row rejected naming its file
    and its position there."""
    rows = conversations()
    root = tmp_path / "in"
    root.mkdir()
    invalid = b'{"id": "broken", "messages": ['
    gz_rows = as_messages(rows[0:4])
    (root / "1-messages.jsonl.gz").write_bytes(gzip.compress(b"".join(
        line + b"\n" for line in [*(orjson.dumps(r) for r in gz_rows[:2]), invalid,
                                  *(orjson.dumps(r) for r in gz_rows[2:])])))
    write_compressed(root / "2-sharegpt.jsonl.zst", as_sharegpt(rows[4:8]))
    write_jsonl(root / "3-batch.jsonl", [
        *as_batch(rows[8:10]),
        {"custom_id": "q0", "url": "/v1/completions", "body": {"prompt": "Plain text 数据"}},
        {"custom_id": "bad-tools", "method": "POST", "url": CHAT,
         "body": {"messages": [{"role": "user", "content": "x"}], "tools": []}}])
    pq.write_table(pa.Table.from_pylist([*as_messages(rows[10:12]),
                                         {"id": "noprompt", "messages": None, "n": 99}]),
                   root / "4-rows.parquet")
    (root / "notes.md").write_text("not an input file")

    out = tmp_path / "out"
    fleetgen("produce", str(root), "--run", "fmt-dir", "--context-length", "8192",
             "--max-output-tokens", "512", "--redis", fleet4.redis_url)
    fleetgen("drain", "--run", "fmt-dir", "--out", str(out), "--redis", fleet4.redis_url)
    broken = derive_id(invalid + b"\n")
    data = assert_exactly_once(out, {f"c{i}" for i in range(12)}
                               | {"q0", "bad-tools", "noprompt", broken})
    assert assert_fleet_content(fleet4, root, data) == 13
    by_id = {r["id"]: r for r in data["results"]}
    for i in range(12):  # the same answer as the same conversation in a plain .jsonl
        assert {k: by_id[f"c{i}"][k] for k in ANSWER} == {k: via_messages[f"c{i}"][k]
                                                         for k in ANSWER}, i
    # Numbered across the files in name order: 5 lines, 4, 4, then the Parquet rows.
    assert {i: by_id[f"c{i}"]["line"] for i in range(12)} == {
        0: 1, 1: 2, 2: 4, 3: 5, 4: 6, 5: 7, 6: 8, 7: 9, 8: 10, 9: 11, 10: 14, 11: 15}
    assert by_id["q0"]["line"] == 12
    # ... and each result names its file and its position there, as a rejection does.
    assert [(by_id[f"c{i}"]["file"], by_id[f"c{i}"]["position"]) for i in (0, 2, 4, 8, 11)] == [
        ("1-messages.jsonl.gz", 1), ("1-messages.jsonl.gz", 4), ("2-sharegpt.jsonl.zst", 1),
        ("3-batch.jsonl", 1), ("4-rows.parquet", 2)]
    # A Batch line comes back whole: an exporter needs custom_id and url.
    assert (by_id["c8"]["custom_id"], by_id["c8"]["url"]) == ("c8", CHAT)
    assert by_id["c8"]["body"]["model"] == "gpt-4o-mini"
    rejected = {r["id"]: (r["line"], r["file"], r["position"], r["reason"])
                for r in data["rejected"]}
    assert rejected[broken][:3] == (3, "1-messages.jsonl.gz", 3)
    assert rejected[broken][3].startswith("invalid_json")
    assert rejected["bad-tools"] == (13, "3-batch.jsonl", 4,
                                     "unsupported_option: body.tools is not supported")
    assert rejected["noprompt"][:3] == (16, "4-rows.parquet", 3)
    assert rejected["noprompt"][3].startswith("no_prompt")
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert (summary["total"], summary["done"], summary["rejected"]) == (16, 13, 3)

    # The run is pinned to these four files: a new one is refused, even now it is complete.
    write_jsonl(root / "0-late.jsonl", as_messages(rows[:1]))
    again = subprocess.run([sys.executable, "-m", "fleetgen", "produce", str(root), "--run",
                            "fmt-dir", "--context-length", "8192", "--max-output-tokens", "512",
                            "--redis", fleet4.redis_url], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == exitcodes.CONFIG, again.stderr
    assert len(again.stderr.strip().splitlines()) == 1 and "Traceback" not in again.stderr
    assert "1 new (0-late.jsonl)" in again.stderr


def test_rows_appended_to_a_finished_runs_file_are_generated(fleet4: LocalFleet,
                                                             tmp_path: Path) -> None:
    """A finished run whose input grew is read again, not called complete: the new rows are
    generated and written once, the old ones are neither sent nor written again."""
    rows = as_messages(conversations())
    prompts = write_jsonl(tmp_path / "grow.jsonl", rows[:8])
    out = tmp_path / "out"
    produce = ("produce", str(prompts), "--run", "fmt-grow", "--context-length", "8192",
               "--max-output-tokens", "512", "--redis", fleet4.redis_url)
    drain = ("drain", "--run", "fmt-grow", "--out", str(out), "--redis", fleet4.redis_url)
    fleetgen(*produce)
    fleetgen(*drain)
    assert_exactly_once(out, {f"c{i}" for i in range(8)})
    assert "already complete" in fleetgen(*produce).stdout  # unchanged: nothing to do
    with prompts.open("ab") as f:
        f.writelines(orjson.dumps(r) + b"\n" for r in rows[8:])
    again = fleetgen(*produce).stdout
    assert "input has changed since" in again and "4 enqueued" in again, again
    assert "8 already done" in again, again
    fleetgen(*drain)
    data = assert_exactly_once(out, {f"c{i}" for i in range(12)})
    assert assert_fleet_content(fleet4, prompts, data) == 12
    assert not any("file" in r or "position" in r for r in data["results"])  # one file
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert (summary["total"], summary["done"], summary["complete"]) == (12, 12, True)
    assert "already complete" in fleetgen(*produce).stdout
