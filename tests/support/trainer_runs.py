"""The real CLI runs the trainers judge: their input rows, the commands (`fleetgen produce` and
`fleetgen drain` on a local fleet of simulated thinking-model servers, with --token-ids), and
every answer they generated with the prompt ids it was sent, recomputed here."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from fleetgen.local.fleet import LocalFleet
from fleetgen.records.outcomes import ids_digest
from tests.support.cli import fleetgen
from tests.support.content import tokenizer
from tests.support.pipeline import write_jsonl

SYSTEM = {"role": "system", "content": "Answer in one short line."}
NO_THINKING = {"enable_thinking": False}


@dataclass(frozen=True)
class Run:
    name: str
    rows: list[dict[str, Any]]
    args: tuple[str, ...]  # produce's options beyond the common ones
    kwargs: dict[str, Any]  # the run's --chat-template-kwargs
    turns_all: bool = False


def single_rows(n: int = 32) -> list[dict[str, Any]]:
    """--turns last: thinking rows with a system turn, rows that turn thinking off, raw
    prompts, conversations that carry the dataset's own earlier answers (ShareGPT and
    role/content), some ending on an answer the producer drops."""
    rows: list[dict[str, Any]] = []
    for i in range(n):
        ask = {"role": "user", "content": f"What is {i} x 7? 数据"}
        trailing = [{"role": "assistant", "content": "an old answer"}] if i % 5 == 0 else []
        kind = i % 4
        if kind == 0:
            rows.append({"id": f"sys{i}", "messages": [SYSTEM, ask, *trailing], "k": i})
        elif kind == 1:
            rows.append({"id": f"off{i}", "messages": [ask, *trailing],
                         "chat_template_kwargs": NO_THINKING})
        elif kind == 2:
            rows.append({"id": f"raw{i}", "prompt": f"Once upon a time, {i} cats"})
        else:
            history = [{"role": "user", "content": f"Name {i}."},
                       {"role": "assistant", "content": f"{i}, from the dataset."}]
            turns = [*history, ask, *trailing]
            if i % 8 == 3:
                rows.append({"id": f"gpt{i}", "conversations": [
                    {"from": "human" if t["role"] == "user" else "gpt", "value": t["content"]}
                    for t in turns]})
            else:
                rows.append({"id": f"hist{i}", "conversations": turns})
    return rows


def multi_rows(n: int = 10) -> list[dict[str, Any]]:
    """--turns all: 1 to 3 user turns, the dataset's answers between them (discarded), some
    with a system turn, some with thinking off."""
    rows: list[dict[str, Any]] = []
    for i in range(n):
        messages: list[dict[str, Any]] = [SYSTEM] if i % 3 == 0 else []
        for j in range(1 + i % 3):
            if j:
                messages.append({"role": "assistant", "content": f"dataset answer {j}"})
            messages.append({"role": "user", "content": f"Turn {j + 1} of {i}: {i * 3 + j}?"})
        row: dict[str, Any] = {"id": f"c{i}", "messages": messages}
        if i % 4 == 1:
            row["chat_template_kwargs"] = NO_THINKING
        rows.append(row)
    return rows


RUNS = (
    Run("single", single_rows(), ("--max-output-tokens", "64"), {}),
    Run("multi", multi_rows(), ("--max-output-tokens", "96", "--n", "2"), {}, turns_all=True),
    Run("preserve", multi_rows(), ("--max-output-tokens", "96"),
        {"preserve_thinking": True}, turns_all=True),
)


def produce(fleet: LocalFleet, run: Run, work: Path) -> Path:
    """The run through the CLI; its output directory."""
    prompts = write_jsonl(work / f"{run.name}.jsonl", run.rows)
    out = work / run.name
    common = ("--run", run.name, "--context-length", "8192", "--token-ids", "--redis",
              fleet.redis_url, *run.args)
    if run.kwargs:
        common += ("--chat-template-kwargs", orjson.dumps(run.kwargs).decode())
    if not run.turns_all:
        fleetgen("produce", str(prompts), *common)
        fleetgen("drain", "--run", run.name, "--out", str(out), "--redis", fleet.redis_url)
        return out
    drain = subprocess.Popen([sys.executable, "-m", "fleetgen", "drain", "--run", run.name,
                              "--out", str(out), "--redis", fleet.redis_url],
                             env=dict(os.environ), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        fleetgen("produce", str(prompts), *common, "--turns", "all", "--out", str(out),
                 "--reconcile-interval", "2")
        stdout, stderr = drain.communicate(timeout=120)
        assert drain.returncode == 0, f"fleetgen drain: {stdout}{stderr}"
    finally:
        if drain.poll() is None:
            drain.kill()
    return out


def results(out: Path) -> list[dict[str, Any]]:
    lines = (out / "results.jsonl").read_bytes().splitlines()
    return sorted((orjson.loads(x) for x in lines),
                  key=lambda r: (r["line"], r.get("sample") or 0, r.get("turn") or 0))


@dataclass(frozen=True)
class Answer:
    """One generated answer: what the model was sent and what it returned."""

    key: str  # id[#sample][@turn]
    record: dict[str, Any]
    prompt_ids: list[int]
    thought: bool  # the prompt opened a think block (the model reasoned)

    @property
    def output_ids(self) -> list[int]:
        return list(self.record["output_ids"])

    @property
    def finished(self) -> bool:
        record = self.record
        return (record["finish_reason"] == "stop" and not record.get("reasoning_unfinished")
                and bool(str(record.get("completion") or "").strip()))


def answers(run: Run, out: Path) -> list[Answer]:
    """Every result of the run with the ids it was sent, rendered here from the input row as
    the producer renders it (the row's template options over the run's; with --turns all the
    user turns with this run's earlier answers between them) and proved to be the ids sent by
    the digest the worker recorded."""
    by_id = {row["id"]: row for row in run.rows}
    records = results(out)
    by_turn = {(r["id"], r.get("sample"), r.get("turn")): r for r in records}
    found = []
    for record in records:
        row = by_id[record["id"]]
        kwargs = {**run.kwargs, **(row.get("chat_template_kwargs") or {})}
        earlier = [by_turn[(record["id"], record.get("sample"), k)]
                   for k in range(1, int(record.get("turn") or 1))]
        text = prompt_text(row, kwargs, earlier if run.turns_all else None)
        ids = tokenizer().encode_batch([text])[0]
        assert ids_digest(ids) == record["prompt_ids_digest"], record["id"]
        key = record["id"] + (f"#{record['sample']}" if record.get("sample") is not None
                              else "") + (f"@{record['turn']}" if record.get("turn") else "")
        found.append(Answer(key, record, ids, text.endswith("<think>\n")))
    return found


def prompt_text(row: dict[str, Any], kwargs: dict[str, Any],
                earlier: list[dict[str, Any]] | None) -> str:
    """The prompt the producer renders for a row: a raw prompt as it is; else its turns less
    the trailing answers (with --turns all, `earlier`: this run's answers in place of the
    dataset's) through the chat template."""
    if "prompt" in row:
        return str(row["prompt"])
    turns = [{"role": {"human": "user", "gpt": "assistant"}.get(t["from"], t["from"]),
              "content": t["value"]} if "from" in t else t
             for t in row.get("messages") or row["conversations"]]
    while turns[-1]["role"] == "assistant":
        turns.pop()
    if earlier is not None:
        turns = with_answers(turns, earlier)
    return tokenizer().render(turns, kwargs)


def with_answers(turns: list[dict[str, Any]],
                 earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """--turns all: turn k's prompt, the user turns with this run's answers 1..k-1 between
    them (the dataset's discarded)."""
    messages: list[dict[str, Any]] = []
    asked = 0
    for turn in turns:
        if turn["role"] == "assistant":
            continue
        if turn["role"] == "user":
            if asked == len(earlier) + 1:
                break
            if asked:
                previous = earlier[asked - 1]
                answer = {"role": "assistant", "content": previous["completion"]}
                if isinstance(previous.get("reasoning"), str):
                    answer["reasoning_content"] = previous["reasoning"]
                messages.append(answer)
            asked += 1
        messages.append(turn)
    return messages
