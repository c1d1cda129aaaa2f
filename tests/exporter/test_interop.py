"""The exports load as they are with Hugging Face `datasets` (offline) and pandas: the readers
training pipelines use. `datasets` runs in a child process, so its offline settings and cache
are this test's own whatever was imported before."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tests.support.cli import Export
from tests.support.trainers import load_dataset


def test_conversations_load_with_datasets_and_pandas(export: Export, drained: Path,
                                                     tmp_path: Path) -> None:
    """As SpecForge loads its training file (`load_dataset("json", ...)`, then the
    `conversations` column, specforge/data/prompt_builder.py and preprocessing.py), and the
    Parquet twin the same way."""
    assert export(drained, "--format", "conversations").code == 0
    path = drained / "export.conversations.jsonl"
    ds = load_dataset("json", path, tmp_path)
    assert ds["rows"] == 10  # the answer cut at its budget left out
    assert {"id", "conversations", "status", "finish_reason", "sample"} <= set(ds["columns"])
    assert "messages" not in ds["columns"]  # one conversation column, whatever the input's
    assert ds["first"]["id"] == "a"
    assert ds["first"]["status"] == "success"
    assert ds["first"]["conversations"][-1]["role"] == "assistant"
    assert ds["first"]["conversations"][-1]["content"] == "7."
    assert ds["last"]["conversations"][-1]["content"] == "Done."
    frame = pd.read_json(path, lines=True)
    assert len(frame) == 10
    assert frame["id"].tolist()[:5] == ["a", "b", "d", "i", "i"]
    assert frame.loc[1, "conversations"][-1] == {
        "role": "assistant", "content": "It is 4.", "reasoning_content": "2+2 is 4, not 5."}
    table = tmp_path / "train.parquet"
    assert export(drained, "--format", "conversations", "--out", table).code == 0
    twin = load_dataset("parquet", table, tmp_path)
    assert twin["rows"] == 10 and set(twin["columns"]) == set(ds["columns"]) - {
        "chat_template_kwargs"}  # empty on every row: Parquet has no struct without fields
    assert twin["first"]["conversations"][0] == {
        "role": "system", "content": "You are terse.", "reasoning_content": None,
        "generated": None}


def test_openai_batch_loads_with_datasets_and_pandas(export: Export, drained: Path,
                                                     tmp_path: Path) -> None:
    assert export(drained, "--format", "openai-batch").code == 0
    path = drained / "export.openai-batch.jsonl"
    ds = load_dataset("json", path, tmp_path)
    assert ds["rows"] == 14
    assert set(ds["columns"]) == {"id", "custom_id", "response", "error"}
    assert ds["first"]["custom_id"] == "a"
    assert ds["first"]["response"]["status_code"] == 200
    assert ds["first"]["response"]["body"]["choices"][0]["message"]["content"] == "7."
    assert ds["last"]["response"]["body"]["usage"]["total_tokens"] == 25
    frame = pd.read_json(path, lines=True)
    assert len(frame) == 14
    statuses = [r["status_code"] if isinstance(r, dict) else None for r in frame["response"]]
    assert statuses == [200, 200, 200, 200, 400, 400, 400, None, 200, 503, 200, 200, 400, 200]
    assert frame["error"].notna().sum() == 6


def test_parquet_loads_with_datasets_and_pandas(export: Export, drained: Path,
                                                tmp_path: Path) -> None:
    assert export(drained, "--format", "parquet").code == 0
    path = drained / "export.parquet"
    ds = load_dataset("parquet", path, tmp_path)
    assert ds["rows"] == 11
    assert ds["columns"][:3] == ["id", "completion", "finish_reason"]
    assert ds["first"]["messages"][0] == {"role": "system", "content": "You are terse."}
    assert ds["last"]["completion"] == "Done."
    frame = pd.read_parquet(path)
    assert len(frame) == 11
    assert frame["completion_tokens"].dtype == "int64"
    assert frame["sample"].tolist()[4:8] == [0, 1, 2, 0]
    assert list(frame.loc[4, "logprobs"]["ids"]) == [11, 12]
