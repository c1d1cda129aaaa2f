"""A real run exported for SpecForge: producer, Celery workers and simulators modelling a thinking
model (`--thinking`), the drainer, then `fleetgen export --format conversations
--only-finished` through the real CLI. SpecForge's rules (tests/support/specforge.py) must
hold on every line, and every line must hold what the run wrote: the input's turns as
role/content, the answer and its reasoning where SpecForge's ThinkingParser reads them (the
chat template renders them back into exactly the prompt the model got plus what it wrote),
and what --only-finished left out counted by reason."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from fleetgen.local.fleet import LocalFleet
from producer.tokenizer import load_tokenizer
from tests.support.cli import cli
from tests.support.fleet import started_fleet
from tests.support.pipeline import assert_exactly_once, write_jsonl
from tests.support.specforge import violations
from tests.support.trainers import load_dataset

ROWS = 32
SHAREGPT = {"system": "system", "user": "human", "assistant": "gpt"}
SYSTEM = {"role": "system", "content": "Answer in one line."}


@pytest.fixture(scope="module")
def thinking_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    # Reasoning and answer are each about 40 tokens: under a 64-token budget some answers
    # finish, some are cut in the answer (length) and some inside the reasoning.
    yield from started_fleet(tmp_path_factory.mktemp("specforge"), gpus=2,
                             output_tokens_mean=40, sim_args=["--thinking"])


def input_rows() -> list[dict[str, Any]]:
    """Three conversation shapes, some with history and a trailing answer to drop."""
    rows: list[dict[str, Any]] = []
    for i in range(ROWS):
        turns: list[dict[str, str]] = [{"role": "user", "content": f"What is {i} x 7? 数据"}]
        if i % 2:
            turns = [{"role": "user", "content": f"Name {i}."},
                     {"role": "assistant", "content": f"{i}."}, *turns]
        if i % 5 == 0:
            turns.append({"role": "assistant", "content": "an old answer"})
        if i % 3 == 0:
            rows.append({"id": f"m{i}", "messages": [SYSTEM, *turns], "k": i})
        elif i % 3 == 1:
            rows.append({"id": f"s{i}", "source": "sharegpt", "conversations": [
                {"from": SHAREGPT[t["role"]], "value": t["content"]} for t in turns]})
        else:
            rows.append({"id": f"r{i}", "conversations": turns})
    return rows


def asked(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The turns the row asked about, as role/content: the trailing answer dropped."""
    turns = [{"role": {v: k for k, v in SHAREGPT.items()}[t["from"]], "content": t["value"]}
             if "from" in t else t for t in row.get("messages") or row["conversations"]]
    while turns[-1]["role"] == "assistant":
        turns.pop()
    return turns


def unfinished(record: dict[str, Any]) -> str | None:
    """Why --only-finished must leave a result out (docs/formats.md, Export), from its fields."""
    if record["reasoning_unfinished"]:
        return "reasoning_unfinished"
    if record["finish_reason"] == "length":
        return "length"
    return None if record["completion"].strip() else "empty"


def test_a_thinking_run_exports_as_specforge_reads_it(thinking_fleet: LocalFleet,
                                                      tmp_path: Path) -> None:
    rows = input_rows()
    source = write_jsonl(tmp_path / "prompts.jsonl", rows)
    out, redis = tmp_path / "out", thinking_fleet.redis_url
    for args in (("produce", str(source), "--run", "spec", "--context-length", "8192",
                  "--max-output-tokens", "64", "--redis", redis),
                 ("drain", "--run", "spec", "--out", str(out), "--redis", redis)):
        done = cli(*args)
        assert done.returncode == 0, done.stderr
    results = sorted(assert_exactly_once(out, {r["id"] for r in rows})["results"],
                     key=lambda r: r["line"])
    assert len(results) == ROWS
    why = Counter(unfinished(r) for r in results)
    assert why["length"] and why["reasoning_unfinished"] and why[None], why

    target = tmp_path / "train.jsonl"
    done = cli("export", str(out), "--format", "conversations", "--only-finished",
               "--out", str(target))
    assert done.returncode == 0, done.stderr
    left = {r: n for r, n in why.items() if r is not None}
    assert done.stdout.strip() == (
        f"fleetgen export: {why[None]} lines of run 'spec' -> {target}; left out "
        f"{sum(left.values())} unfinished ("
        + ", ".join(f"{left[r]} {r}" for r in ("reasoning_unfinished", "length", "empty")
                    if r in left) + ")")
    exported = [orjson.loads(x) for x in target.read_bytes().splitlines()]
    finished = [r for r in results if unfinished(r) is None]
    assert [e["id"] for e in exported] == [r["id"] for r in finished]
    by_id = {r["id"]: r for r in rows}
    for line, record in zip(exported, finished, strict=True):
        assert violations(line, strict_think_markers=True) == [], line
        if len(line["conversations"]) == 2 + ("messages" in by_id[line["id"]]):
            assert violations(line, expect_reasoning=True) == []  # no history answer
        _check_line(line, record, by_id[line["id"]])
    _check_rendering(exported, finished)
    _check_loaders(target, exported, tmp_path)
    sharegpt = next(x for x in target.read_text(encoding="utf-8").splitlines()
                    if '"source":"sharegpt"' in x)
    print(f"\nspecforge: {len(exported)} of {ROWS} exported, left out {left}; a ShareGPT "
          f"row's line:\n{sharegpt}")


def _check_line(line: dict[str, Any], record: dict[str, Any], row: dict[str, Any]) -> None:
    answer = {"role": "assistant", "content": record["completion"],
              "reasoning_content": record["reasoning"]}
    assert isinstance(record["reasoning"], str) and record["reasoning"]
    # The dataset's own history answers are marked: the model did not write them.
    history = [{**t, "generated": False} if t["role"] == "assistant" else t
               for t in asked(row)]
    assert line["conversations"] == [*history, answer], row["id"]
    assert line["thinking"] is True and line["chat_template_kwargs"] == {}
    assert line["status"] == "success"
    assert line["finish_reason"] == "stop"
    assert "messages" not in line and "reasoning" not in line and "completion" not in line
    for key in ("k", "source"):  # the input row's own fields, kept as SpecForge keeps them
        assert line.get(key) == row.get(key)


def _check_rendering(exported: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """What SpecForge's ThinkingParser feeds its tokenizer: the turns through the chat
    template with no generation prompt. It must be the prompt the producer rendered (with the
    generation prompt, as the model got it) followed by the model's own output, reasoning
    first, then the end of the turn: what the drafter is trained to predict. The prompt is
    the one sent: as many tokens as the run counted."""
    hf = load_tokenizer("qwen3.6").hf
    for line, record in zip(exported, records, strict=True):
        turns = line["conversations"]
        prompt = hf.apply_chat_template(turns[:-1], tokenize=False, add_generation_prompt=True)
        assert prompt.endswith("<|im_start|>assistant\n<think>\n")
        assert len(hf(prompt, add_special_tokens=False)["input_ids"]) == \
            record["prompt_tokens"], line["id"]
        full = hf.apply_chat_template(turns, tokenize=False, add_generation_prompt=False)
        last = turns[-1]
        assert full == (f"{prompt}{last['reasoning_content']}\n</think>\n\n"
                        f"{last['content']}<|im_end|>\n"), line["id"]
        # The span ThinkingParser's assistant pattern (`assistant_header ... end_of_turn`,
        # specforge/data/parse.py set_assistant_pattern) supervises holds the reasoning.
        spans = re.findall(r"<\|im_start\|>assistant\n([\s\S]*?<\|im_end\|>)", full)
        assert last["reasoning_content"] in spans[-1] and last["content"] in spans[-1]


def _check_loaders(target: Path, exported: list[dict[str, Any]], tmp_path: Path) -> None:
    """Hugging Face `datasets` offline, as SpecForge loads its file, and the Parquet twin."""
    ds = load_dataset("json", target, tmp_path)
    assert ds["rows"] == len(exported) and "conversations" in ds["columns"]
    assert ds["first"]["conversations"][-1]["reasoning_content"] == \
        exported[0]["conversations"][-1]["reasoning_content"]
    table = target.with_suffix(".parquet")
    done = cli("export", str(target.parent / "out"), "--format", "conversations",
               "--only-finished", "--out", str(table))
    assert done.returncode == 0, done.stderr
    twin = pq.read_table(table).to_pylist()
    # Parquet fills a key a turn lacks (`generated`, set on history answers only) with null.
    assert [(r["id"], {k: v for k, v in r["conversations"][-1].items() if v is not None})
            for r in twin] == [(e["id"], e["conversations"][-1]) for e in exported]
