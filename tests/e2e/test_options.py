"""Thinking, structured output and log-probabilities end to end through the real CLI, on a fleet
of simulators modelling a thinking model (`--thinking`) that writes some JSON documents broken
(`--json-invalid-rate`): every answer is checked against the simulator's own model, split on
`</think>`, and the counts in summary.json and `status` match the lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from fleetgen.local.fleet import LocalFleet
from tests.support.cli import cli, fleetgen
from tests.support.content import assert_fleet_content, tokenizer
from tests.support.fleet import started_fleet
from tests.support.pipeline import assert_exactly_once, write_jsonl

ROWS = 16
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "score": {"type": "integer", "minimum": 0}},
          "required": ["name", "score"]}
ROW_SCHEMA = {"type": "array", "items": {"type": "boolean"}, "minItems": 1}


@pytest.fixture(scope="module")
def thinking_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    yield from started_fleet(tmp_path_factory.mktemp("thinking"), gpus=2,
                             output_tokens_mean=80,
                             sim_args=["--thinking", "--json-invalid-rate", "0.3"])


def prompts(path: Path) -> Path:
    return write_jsonl(path, [
        {"id": f"t{i}", "messages": [{"role": "user", "content": f"Think about {i}, then say."}]}
        for i in range(ROWS)])


def run(fleet: LocalFleet, source: Path, name: str, out: Path, *flags: str
        ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    fleetgen("produce", str(source), "--run", name, "--context-length", "8192",
             "--redis", fleet.redis_url, *flags)
    fleetgen("drain", "--run", name, "--out", str(out), "--redis", fleet.redis_url)
    data = assert_exactly_once(out, {f"t{i}" for i in range(ROWS)} | {"own"}
                               if name == "json" else {f"t{i}" for i in range(ROWS)})
    return data, orjson.loads((out / "summary.json").read_bytes())


def test_reasoning_is_split_from_the_answer(thinking_fleet: LocalFleet, tmp_path: Path) -> None:
    source = prompts(tmp_path / "p.jsonl")
    data, summary = run(thinking_fleet, source, "think", tmp_path / "out",
                        "--max-output-tokens", "512")
    assert assert_fleet_content(thinking_fleet, source, data, options={"think": True}) == ROWS
    results = data["results"]
    assert all(r["reasoning"] and r["reasoning_tokens"] > 0 for r in results)
    assert all("</think>" not in r["completion"] and "<think>" not in r["completion"]
               for r in results)
    assert summary["reasoning_unfinished"] == sum(r["reasoning_unfinished"] for r in results)
    print(f"\nreasoning split: {ROWS} rows, reasoning_tokens "
          f"{sorted(r['reasoning_tokens'] for r in results)[::4]}")


def test_a_budget_that_ends_inside_the_reasoning_is_counted(
        thinking_fleet: LocalFleet, tmp_path: Path) -> None:
    source = prompts(tmp_path / "p.jsonl")
    data, summary = run(thinking_fleet, source, "short", tmp_path / "out",
                        "--max-output-tokens", "16")
    assert assert_fleet_content(thinking_fleet, source, data, options={"think": True}) == ROWS
    unfinished = [r for r in data["results"] if r["reasoning_unfinished"]]
    assert unfinished and all(r["completion"] == "" and r["finish_reason"] == "length"
                              for r in unfinished)
    assert summary["reasoning_unfinished"] == len(unfinished)
    status = orjson.loads(cli("status", "--run", "short", "--json", "--redis",
                              thinking_fleet.redis_url).stdout)
    assert status["unfinished"] == len(unfinished)
    assert status["shares"]["unfinished"] == round(len(unfinished) / ROWS, 4)


def test_thinking_switched_off_by_the_template(thinking_fleet: LocalFleet,
                                               tmp_path: Path) -> None:
    source = prompts(tmp_path / "p.jsonl")
    off = {"enable_thinking": False}
    data, _ = run(thinking_fleet, source, "nothink", tmp_path / "out",
                  "--max-output-tokens", "256", "--chat-template-kwargs", json.dumps(off))
    assert assert_fleet_content(thinking_fleet, source, data, options={"think": True},
                                template_kwargs=off) == ROWS
    plain, closed = tokenizer(), tokenizer("qwen3.6", json.dumps(off))
    for r in data["results"]:
        turns = [{"role": "user", "content": f"Think about {r['id'][1:]}, then say."}]
        # The budget counts the template as rendered: its empty think block is 4 tokens
        # where the open one (`<think>\n`, thinking on) is 2.
        assert r["prompt_tokens"] == closed.count(closed.render(turns)) == \
            plain.count(plain.render(turns)) + 2
        assert r["reasoning"] is None and r["reasoning_tokens"] == 0


def test_a_row_s_own_template_options_override_the_run_s(thinking_fleet: LocalFleet,
                                                         tmp_path: Path) -> None:
    """A mixed set: every other row switches thinking off for itself; the budget, the
    reasoning split and the simulator follow each row's own prompt."""
    off = {"enable_thinking": False}
    source = write_jsonl(tmp_path / "mixed.jsonl", [
        {"id": f"t{i}", "messages": [{"role": "user", "content": f"Think about {i}, then say."}],
         **({"chat_template_kwargs": off} if i % 2 else {})} for i in range(ROWS)])
    data, summary = run(thinking_fleet, source, "mixed", tmp_path / "out",
                        "--max-output-tokens", "512")
    assert assert_fleet_content(thinking_fleet, source, data, options={"think": True}) == ROWS
    plain, closed = tokenizer(), tokenizer("qwen3.6", json.dumps(off))
    by_id = {r["id"]: r for r in data["results"]}
    for i in range(ROWS):
        r = by_id[f"t{i}"]
        turns = [{"role": "user", "content": f"Think about {i}, then say."}]
        rendered = closed.render(turns) if i % 2 else plain.render(turns)
        assert r["prompt_tokens"] == plain.count(rendered)
        assert (r["reasoning"] is None) == bool(i % 2), r
    assert summary["done"] == ROWS


STOPS = (" about", " finally")


def test_stop_strings_end_answers_and_reasoning(thinking_fleet: LocalFleet,
                                                tmp_path: Path) -> None:
    """`--stop`: SGLang ends the answer at the first stop string it writes, in the reasoning
    too (`Req._check_str_based_finish` decodes the tail with its special tokens), and cuts the
    text before it (`trim_matched_stop`): `finish_reason` is `stop`, neither the completion nor
    the reasoning holds a stop string, and a stop hit inside the reasoning leaves no answer
    (`reasoning_unfinished`). Every line is recomputed from the simulator's model."""
    source = prompts(tmp_path / "p.jsonl")
    data, summary = run(thinking_fleet, source, "stops", tmp_path / "out",
                        "--max-output-tokens", "512", *(f"--stop={s}" for s in STOPS))
    results = data["results"]
    for r in results:
        assert not any(s in r["completion"] or s in (r["reasoning"] or "") for s in STOPS), r
    in_reasoning = [r for r in results if r["reasoning_unfinished"]]
    assert in_reasoning and all(r["finish_reason"] == "stop" and r["completion"] == ""
                                for r in in_reasoning), "a stop hit inside the reasoning"
    answered = [r for r in results if r["completion"] and r["finish_reason"] == "stop"]
    assert answered, "answers that got past their reasoning"
    assert summary["reasoning_unfinished"] == len(in_reasoning)
    assert summary["truncated"] == sum(r["finish_reason"] == "length" for r in results)
    assert assert_fleet_content(thinking_fleet, source, data, options={"think": True},
                                sampling={"stop": list(STOPS)}) == ROWS
    print(f"\nstops: {len(in_reasoning)} of {ROWS} stopped inside the reasoning")


def test_json_schema_and_logprobs(thinking_fleet: LocalFleet, tmp_path: Path) -> None:
    source = prompts(tmp_path / "p.jsonl")
    with source.open("ab") as f:  # a row with a schema of its own
        f.write(orjson.dumps({"id": "own", "json_schema": ROW_SCHEMA,
                              "messages": [{"role": "user", "content": "Booleans, please."}]})
                + b"\n")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    data, summary = run(thinking_fleet, source, "json", tmp_path / "out",
                        "--max-output-tokens", "1024", "--json-schema", str(schema),
                        "--logprobs", "3")
    options = {"think": True, "json_schema": json.dumps(SCHEMA, separators=(",", ":")),
               "logprobs": 3}
    assert assert_fleet_content(thinking_fleet, source, data, options=options) == ROWS + 1
    results = {r["id"]: r for r in data["results"]}
    assert isinstance(json.loads(results["own"]["completion"]), list) \
        or not results["own"]["json_valid"]
    invalid = [r for r in results.values() if not r["json_valid"]]
    assert 0 < len(invalid) < ROWS and summary["json_invalid"] == len(invalid)
    for r in results.values():
        lp = r["logprobs"]
        assert len(lp["ids"]) == len(lp["lp"]) == len(lp["top_ids"]) == r["completion_tokens"]
        assert all(len(top) == 3 for top in lp["top_ids"])
    print(f"\njson: {len(invalid)} of {ROWS + 1} answers invalid, counted as such")


def test_a_bad_schema_file_is_one_line(tmp_path: Path) -> None:
    source = prompts(tmp_path / "p.jsonl")
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "objekt"}')
    done = cli("produce", str(source), "--run", "x", "--context-length", "512",
               "--json-schema", str(bad), "--redis", "redis://127.0.0.1:1")
    assert done.returncode == 3 and done.stderr.count("\n") == 1
    assert "not a valid JSON Schema" in done.stderr
