"""`fleetgen export --format tokens` on output directories written by hand: the line per answer
(prompt ids re-rendered with the run's settings and the row's own, then the output ids; the
mask), in input order, as JSONL and Parquet, and every refusal as one line with exit 3 and no
file written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from fleetgen import exitcodes
from fleetgen.records.outcomes import ids_digest
from tests.support.cli import Export
from tests.support.content import tokenizer
from tests.support.outdir import read_jsonl, result

RUN_KWARGS = {"enable_thinking": False}
SETTINGS = {"tokenizer": "qwen3.6", "chat_template_kwargs": RUN_KWARGS, "token_ids": True}


def rows() -> list[tuple[int, dict[str, Any]]]:
    """(input line, row): a chat row, a raw prompt, a ShareGPT row with the answer the producer
    dropped, a row with its own template kwargs, a row sampled twice, an OpenAI Batch line."""
    return [
        (1, {"id": "chat", "messages": [{"role": "user", "content": "Hi 数据"}], "k": 1}),
        (2, {"id": "raw", "prompt": "Once upon a time"}),
        (4, {"id": "gpt", "conversations": [{"from": "human", "value": "Why?"},
                                            {"from": "gpt", "value": "old answer"}]}),
        (5, {"id": "own", "messages": [{"role": "user", "content": "Think."}],
             "chat_template_kwargs": {"enable_thinking": True}}),
        (7, {"id": "two", "messages": [{"role": "user", "content": "Twice"}]}),
        (8, {"id": "b1", "custom_id": "b1", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [{"role": "user", "content": "Batch"}], "max_tokens": 9}}),
    ]


def prompt_ids(row: dict[str, Any]) -> list[int]:
    """The ids the producer sends for a row, spelt out: what the export must re-render."""
    tok = tokenizer("qwen3.6", orjson.dumps(RUN_KWARGS).decode())
    if "prompt" in row:
        text = row["prompt"]
    elif "messages" in row or "body" in row:
        text = tok.render(row.get("messages") or row["body"]["messages"],
                          row.get("chat_template_kwargs"))
    else:
        text = tok.render([{"role": "user", "content": row["conversations"][0]["value"]}])
    return tok.encode_batch([text])[0]


def write_dir(out: Path, settings: dict[str, Any] | None = SETTINGS,
              change: Any = None) -> list[dict[str, Any]]:
    """results.jsonl in a drain order that is not the input's, a marker, summary.json with
    the run's settings; returns the results in input order."""
    results = []
    for line, row in rows():
        ids = prompt_ids(row)
        for sample in ((0, 1) if row["id"] == "two" else (None,)):
            output = [1000 + line, 2000 + (sample or 0), 248046]
            extra: dict[str, Any] = {"output_ids": output, "prompt_ids_digest": ids_digest(ids)}
            if sample is not None:
                extra["sample"] = sample
            results.append(result({k: v for k, v in row.items() if k != "id"}, row["id"],
                                  line, "x", prompt_tokens=len(ids),
                                  completion_tokens=len(output), **extra))
    if change is not None:
        change(results)
    out.mkdir()
    (out / ".fleetgen-run").write_text("tok\n")
    (out / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n"
                                                 for r in reversed(results)))
    summary: dict[str, Any] = {"run": "tok", "complete": True, "finished_at": 1.0}
    if settings is not None:
        summary["settings"] = settings
    (out / "summary.json").write_bytes(orjson.dumps(summary))
    return results


def test_one_line_per_answer_with_the_prompt_as_sent(export: Export, tmp_path: Path) -> None:
    results = write_dir(tmp_path / "out")
    ran = export(tmp_path / "out", "--format", "tokens")
    assert ran.code == exitcodes.OK, ran.err
    lines = read_jsonl(tmp_path / "out" / "export.tokens.jsonl")
    assert [(x["id"], x.get("sample")) for x in lines] == [
        ("chat", None), ("raw", None), ("gpt", None), ("own", None), ("two", 0), ("two", 1),
        ("b1", None)]
    by_row = dict(rows())
    for line, record in zip(lines, results, strict=True):
        prompt = prompt_ids(by_row[record["line"]])
        assert line == {"id": record["id"], **({"sample": record["sample"]}
                                                if "sample" in record else {}),
                        "input_ids": prompt + record["output_ids"],
                        "loss_mask": [0] * len(prompt) + [1] * 3, "finish_reason": "stop"}
    # The row's own kwargs went over the run's: its prompt ends inside an open think block.
    decode = tokenizer().decode  # type: ignore[attr-defined]
    assert decode(lines[3]["input_ids"][:-3]).endswith("<think>\n")
    assert decode(lines[0]["input_ids"][:-3]).endswith("<think>\n\n</think>\n\n")


def test_parquet_when_out_ends_in_parquet(export: Export, tmp_path: Path) -> None:
    write_dir(tmp_path / "out")
    assert export(tmp_path / "out", "--format", "tokens").code == exitcodes.OK
    ran = export(tmp_path / "out", "--format", "tokens", "--out", tmp_path / "t.parquet")
    assert ran.code == exitcodes.OK, ran.err
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.column_names == ["id", "sample", "input_ids", "loss_mask", "finish_reason",
                                  "unfinished"]
    lines = read_jsonl(tmp_path / "out" / "export.tokens.jsonl")
    assert [{k: v for k, v in r.items() if v is not None} for r in table.to_pylist()] == lines


def _drop_ids(results: list[dict[str, Any]]) -> None:
    del results[2]["output_ids"]


def _edit_row(results: list[dict[str, Any]]) -> None:
    results[0]["messages"][0]["content"] += " and more words than before"


def _other_ids(results: list[dict[str, Any]]) -> None:
    results[3]["prompt_ids_digest"] = ids_digest([1, 2, 3])  # same count, other ids sent


def _bad_row(results: list[dict[str, Any]]) -> None:
    results[1]["prompt"] = 7


@pytest.mark.parametrize(("settings", "change", "said"), [
    (None, None, "holds no run settings"),
    ({**SETTINGS, "token_ids": False}, None, "produced without --token-ids"),
    (SETTINGS, _drop_ids, "row 'gpt' (input line 4) has no output_ids"),
    (SETTINGS, _edit_row, "row 'chat' (input line 1): its prompt renders to other ids"),
    (SETTINGS, _other_ids, "row 'own' (input line 5): its prompt renders to other ids"),
    (SETTINGS, _bad_row, "row 'raw' (input line 2): its prompt cannot be rendered again"),
    ({**SETTINGS, "tokenizer": "/no/such/tokenizer"}, None, "neither a known name"),
], ids=["no-settings", "no-flag", "no-ids", "changed-row", "other-ids", "unreadable-row",
        "no-tokenizer"])
def test_refusals_are_one_line_and_write_nothing(export: Export, tmp_path: Path,
                                                 settings: Any, change: Any,
                                                 said: str) -> None:
    write_dir(tmp_path / "out", settings, change)
    ran = export(tmp_path / "out", "--format", "tokens")
    assert ran.code == exitcodes.CONFIG
    assert said in ran.err and ran.err.count("\n") == 1, ran.err
    assert not (tmp_path / "out" / "export.tokens.jsonl").exists()
