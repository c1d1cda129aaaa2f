"""Runs a drafter trainer's own data code on an export and prints what it would train on.

Run by the trainers' interpreter (.venv/trainers, `make trainers`), never imported by the suite:
SpecForge 0.2.0 and vLLM speculators 0.9.0 as their users run them, nothing copied.

    judge.py JOBS OUT

JOBS: a JSON list of {"trainer": "specforge"|"speculators", "path", "tokenizer_dir",
"train_only_last_turn" (SpecForge), "render_endpoint" (speculators)}; one process for them all
(torch's import is most of a job's time).

SpecForge: `specforge.data.prompt_builder.prepare_prompt_tasks` with the fields of its data
config as `examples/configs/qwen3.6-27b-dflash-online.yaml` sets them (`chat_template:
qwen3.5`), the tokenizer loaded by `specforge.utils.load_tokenizer`; the path it reads as
`prompts_path` (pre-tokenized) or `train_data_path` (conversations) alike.
speculators: `speculators.data_generation.preprocessing.load_and_preprocess_dataset` (what
`speculators prepare-data` calls), conversations rendered by the endpoint given.

Writes to OUT a JSON list, for each job {"rows": [{"input_ids", "loss_mask"}, ...]} in the
trainer's order, or {"error": "Type: message"} when the trainer refuses the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

MAX_LENGTH = 16384  # longer than any test row: no truncation


def specforge(path: str, tokenizer_dir: str, train_only_last_turn: bool) -> list[dict]:
    from specforge.data.prompt_builder import prepare_prompt_tasks
    from specforge.utils import load_tokenizer

    tasks = prepare_prompt_tasks(
        path, load_tokenizer(tokenizer_dir), chat_template="qwen3.5", max_length=MAX_LENGTH,
        is_preformatted=False, train_only_last_turn=train_only_last_turn, cache_dir=None,
        cache_key=None, num_proc=1, min_loss_tokens=1)
    return [task["payload"] for task in tasks]


def speculators(path: str, tokenizer_dir: str, render_endpoint: str | None) -> list[dict]:
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    dataset, _ = load_and_preprocess_dataset(
        tokenizer_dir, [path], seq_length=MAX_LENGTH, build_dataset_num_proc=1,
        render_endpoint=render_endpoint, allow_empty_output=True)
    return [{"input_ids": row["input_ids"].tolist(), "loss_mask": row["loss_mask"].tolist()}
            for row in dataset]


def judge(job: dict) -> dict:
    try:
        if job["trainer"] == "specforge":
            rows = specforge(job["path"], job["tokenizer_dir"],
                             bool(job.get("train_only_last_turn")))
        else:
            rows = speculators(job["path"], job["tokenizer_dir"], job.get("render_endpoint"))
    except Exception as exc:  # the trainer's refusal is the answer
        return {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    return {"rows": [{"input_ids": [int(i) for i in row["input_ids"]],
                      "loss_mask": [int(m) for m in row["loss_mask"]]} for row in rows]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("jobs")
    parser.add_argument("out")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with open(args.jobs, encoding="utf-8") as stream:
        jobs = json.load(stream)
    answers = [judge(job) for job in jobs]
    with open(args.out, "w", encoding="utf-8") as out:  # stdout is the trainers' log
        json.dump(answers, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
