"""What the drafter trainers' loaders accept as pre-tokenized rows, copied from their sources so
the tests hold our `tokens` export to them (neither trainer is installable here: both need
torch and GPUs). Only the checks are copied; torch tensors became lists.

- SpecForge (sgl-project/SpecForge a6b6b02, Apache-2.0), `specforge/data/prompt_builder.py`:
  `prepare_prompt_tasks` reads a `prompts_path` JSONL whose first record has `input_ids` and
  `loss_mask` through `_iter_records` and `_prompt_from_record` (with
  `_normalize_integer_sequence`).
- vLLM speculators (vllm-project/speculators c05b95b, Apache-2.0),
  `src/speculators/data_generation/preprocessing.py`: `load_raw_dataset` loads a local .jsonl
  with `datasets.load_dataset("json", ...)`; `build_speculator_training_dataset` takes the rows
  as they are when `{"input_ids", "loss_mask"} <= set(dataset.column_names)`, then
  `_passthrough_pretokenized` and `_append_row` (clip to `max_length`, drop rows without a
  supervised token).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

import orjson


# -- SpecForge: specforge/data/prompt_builder.py ----------------------------------------------
def specforge_prompt_tasks(path: Path, max_length: int = 1 << 20,
                           min_loss_tokens: int = 1) -> list[dict[str, Any]]:
    """`prepare_prompt_tasks` on the pre-tokenized path: every line through
    `_prompt_from_record`; raises ValueError as SpecForge does."""
    records = []
    with open(path, encoding="utf-8") as stream:  # `_iter_records`, the JSONL branch
        for line_number, line in enumerate(stream, start=1):
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"JSON record in {path!r} at line {line_number} must be an "
                                 "object")
            records.append((record, f"{path}:{line_number}"))
    first = records[0][0] if records else {}
    if ("input_ids" in first) != ("loss_mask" in first):
        raise ValueError("pre-tokenized prompt record must contain both input_ids and loss_mask")
    if "input_ids" not in first:
        raise ValueError(f"{path}: not pre-tokenized (no input_ids in the first record)")
    prompts = []
    for record, source in records:
        prompt = _prompt_from_record(record, source=source, max_length=max_length,
                                     min_loss_tokens=min_loss_tokens)
        if prompt is not None:
            prompts.append(prompt)
    return prompts


def _prompt_from_record(record: Mapping[str, Any], *, source: str, max_length: int,
                        min_loss_tokens: int) -> dict[str, Any] | None:
    if "input_ids" not in record or "loss_mask" not in record:
        raise ValueError(f"{source} must contain both input_ids and loss_mask")
    input_ids = _normalize_integer_sequence(record["input_ids"], field="input_ids",
                                            source=source, binary=False)
    loss_mask = _normalize_integer_sequence(record["loss_mask"], field="loss_mask",
                                            source=source, binary=True)
    if len(input_ids) != len(loss_mask):
        raise ValueError(f"{source} has mismatched input_ids/loss_mask lengths: "
                         f"{len(input_ids)} != {len(loss_mask)}")
    if not input_ids:
        raise ValueError(f"{source} contains an empty token sequence")
    input_ids = input_ids[:max_length]
    loss_mask = loss_mask[:max_length]
    if sum(loss_mask) < min_loss_tokens:
        return None
    return {"payload": {"input_ids": input_ids, "loss_mask": loss_mask}}


def _normalize_integer_sequence(value: Any, *, field: str, source: str,
                                binary: bool) -> list[int]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ValueError(f"{source} field {field} must be a sequence")
    sequence = list(value)
    if len(sequence) == 1 and _is_sequence(sequence[0]):
        sequence = list(sequence[0])
    if any(_is_sequence(item) for item in sequence):
        raise ValueError(f"{source} field {field} must be one-dimensional")
    normalized: list[int] = []
    for index, item in enumerate(sequence):
        is_invalid_token_id = field == "input_ids" and isinstance(item, bool)
        if not isinstance(item, Integral) or is_invalid_token_id:
            raise ValueError(f"{source} field {field}[{index}] must be an integer, got "
                             f"{type(item).__name__}")
        integer = int(item)
        if binary and integer not in (0, 1):
            raise ValueError(f"{source} field {field}[{index}] must be 0 or 1, got {integer}")
        normalized.append(integer)
    return normalized


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


# -- speculators: src/speculators/data_generation/preprocessing.py ---------------------------
def speculators_rows(path: Path, max_length: int = 1 << 20,
                     minimum_valid_tokens: int | None = None) -> dict[str, list[Any]]:
    """`load_raw_dataset` + `build_speculator_training_dataset` on pre-tokenized rows; the
    columns it keeps (`input_ids`, `loss_mask`, `seq_len`)."""
    from datasets import load_dataset

    dataset = load_dataset("json", data_files=str(path), split="train")
    if not {"input_ids", "loss_mask"} <= set(dataset.column_names):
        raise ValueError("render_endpoint is required to convert natural-language "
                         "conversations to speculator training rows")
    examples = dataset.to_dict()
    results: dict[str, list[Any]] = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for ids, mask in zip(examples["input_ids"], examples["loss_mask"], strict=True):
        if len(ids) != len(mask):
            raise ValueError(f"Speculator-format row shape mismatch: input_ids={len(ids)}, "
                             f"loss_mask={len(mask)}")
        _append_row(results, ids, mask, max_length, minimum_valid_tokens)
    return results


def _append_row(results: dict[str, list[Any]], input_ids: list[int], loss_mask: list[int],
                max_length: int, minimum_valid_tokens: int | None) -> str:
    input_ids = input_ids[:max_length]
    loss_mask = loss_mask[:max_length]
    num_valid_tokens = sum(loss_mask)
    if num_valid_tokens == 0:
        return "unsupervised"
    if minimum_valid_tokens is not None and num_valid_tokens < minimum_valid_tokens:
        return "filtered"
    results["input_ids"].append(list(input_ids))
    results["loss_mask"].append(list(loss_mask))
    results["seq_len"].append(len(input_ids))
    return "kept"


LOAD = """
import json, sys
from datasets import load_dataset

kind, path = sys.argv[1], sys.argv[2]
ds = load_dataset(kind, data_files=path, split="train")
print(json.dumps({"rows": ds.num_rows, "columns": ds.column_names,
                  "first": ds[0], "last": ds[-1]}, default=str))
"""


def load_dataset(kind: str, path: Path, cache: Path) -> dict[str, Any]:
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=str(cache / "hf"), HF_DATASETS_CACHE=str(cache / "datasets"))
    done = subprocess.run([sys.executable, "-c", LOAD, kind, str(path)], capture_output=True,
                          text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, Any] = orjson.loads(done.stdout.splitlines()[-1])
    return loaded
