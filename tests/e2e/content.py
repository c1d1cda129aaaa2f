"""Content checks: every result row must hold exactly what the simulator answers for its input.

The simulator's answer is a pure function of the input ids, its `--seed`, the request's
`sampling_seed` and the token budget (docs/simulator.md). So for each result row we
re-read the input row, render and tokenize it exactly as the producer does, ask the
simulator's own model what it answers under the row's `max_tokens`, and compare
`completion`, `completion_tokens`, `finish_reason` and `prompt_tokens`. A row attached to
the wrong prompt, a completion cut or duplicated, a budget that is not the one sent, or a
prompt rendered differently from what the producer sent fails here.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from fleetgen.local.fleet import LocalFleet
from producer.options import sample_seed
from producer.rows import Row, read_rows
from producer.tokenizer import PromptTokenizer, load_tokenizer
from simulator.cli import add_arguments, config_from_args
from simulator.config import SimConfig
from simulator.model import generate, request_key
from simulator.protocol import schedule_limit, vllm_limit

CHECKED = ("completion", "completion_tokens", "finish_reason", "prompt_tokens")
REQUIRED = ("id", "line", "worker", "max_tokens", *CHECKED)

# The worker's name ("gpu2@host") -> the simulator config that served it.
ConfigFor = Callable[[str], SimConfig]


@functools.lru_cache(maxsize=4)
def tokenizer(name: str = "qwen3.6") -> PromptTokenizer:
    return load_tokenizer(name)


def input_ids(prompts: Path, wanted: set[str],
              tokenizer_name: str = "qwen3.6") -> dict[str, list[int]]:
    """Row id -> the token ids the producer sends for it (render with the chat template
    unless the row is a plain `prompt`, then tokenize; producer/pipeline.py), for the
    first row with each wanted id (the first occurrence wins, as in the producer)."""
    tok = tokenizer(tokenizer_name)
    rows: list[Row] = []
    seen: set[str] = set()
    for row in read_rows(prompts):
        if row.id in wanted and row.id not in seen:
            seen.add(row.id)
            if isinstance(row, Row):
                rows.append(row)
    texts = [r.prompt if r.prompt is not None else tok.render(r.messages or []) for r in rows]
    ids = tok.encode_batch(texts) if texts else []
    return {row.id: row_ids for row, row_ids in zip(rows, ids, strict=True)}


def sim_config(argv: Iterable[str]) -> SimConfig:
    """The SimConfig a `python -m simulator` command line builds (simulator/cli.py)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def fleet_configs(fleet: LocalFleet) -> ConfigFor:
    """Per GPU, the config of the simulator the fleet started for it (its own flags)."""
    configs: dict[str, SimConfig] = {}
    for gpu in range(fleet.spec.gpus):
        argv = fleet._sim_argv(1, fleet.spec.gpu_sim_args.get(gpu, []))
        configs[f"gpu{gpu}"] = sim_config(argv[argv.index("simulator") + 1:])

    def config_for(worker: str) -> SimConfig:
        return configs[worker.split("@")[0]]

    return config_for


def expected(ids: list[int], max_tokens: int, config: SimConfig,
             sampling: Mapping[str, Any]) -> dict[str, Any]:
    """What the simulator answers for these ids under this budget (simulator/protocol.py
    `_build_job`, simulator/server.py `_answer`)."""
    prompt_tokens = len(ids) + config.extra_prompt_tokens
    max_new = vllm_limit(prompt_tokens, max_tokens, config) if config.flavor == "vllm" \
        else schedule_limit(prompt_tokens, max_tokens, config)
    key = request_key(config.seed, ids, 0, sampling.get("seed"))
    answer = generate(key, config.output_tokens_mean, max_new)
    return {"completion": answer.text, "completion_tokens": answer.completion_tokens,
            "finish_reason": answer.finish_reason["type"], "prompt_tokens": prompt_tokens}


def row_sampling(row: Mapping[str, Any], sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling options the producer sent for this result: one sample of several has a
    seed of its own (producer/options.py `sample_seed`)."""
    if "sample" not in row:
        return dict(sampling)
    return {**sampling, "seed": sample_seed(row["id"], row["sample"], sampling.get("seed"))}


def assert_content(results: list[dict[str, Any]], prompts: Path,
                   configs: ConfigFor | SimConfig, *,
                   sampling: Mapping[str, Any] | None = None,
                   tokenizer_name: str = "qwen3.6") -> int:
    """Every result row equals the simulator's answer for its input row; returns the count."""
    config_for: ConfigFor = (configs if callable(configs)
                             else lambda _worker, c=configs: c)  # type: ignore[misc]
    ids_by_id = input_ids(prompts, {str(r.get("id")) for r in results}, tokenizer_name)
    bad: list[str] = []
    for row in results:
        nulls = [name for name in REQUIRED if row.get(name) is None]
        if nulls:
            bad.append(f"{row.get('id')!r}: null or missing {nulls}")
            continue
        if row["id"] not in ids_by_id:
            bad.append(f"{row['id']!r}: no such input row")
            continue
        want = expected(ids_by_id[row["id"]], row["max_tokens"], config_for(row["worker"]),
                        row_sampling(row, sampling or {}))
        got = {name: row[name] for name in CHECKED}
        if got != want:
            diff = {k: (got[k], want[k]) for k in CHECKED if got[k] != want[k]}
            bad.append(f"{row['id']!r} (from {row['worker']}): got/expected "
                       f"{ {k: _short(v) for k, v in diff.items()} }")
    assert not bad, f"{len(bad)} of {len(results)} results differ from the simulator's " \
                    f"answer:\n" + "\n".join(bad[:10])
    return len(results)


def assert_fleet_content(fleet: LocalFleet, prompts: Path, data: Mapping[str, Any], *,
                         sampling: Mapping[str, Any] | None = None) -> int:
    """assert_content for a LocalFleet's output (read_output's dict or a results list);
    fails if there is nothing to check."""
    results = data["results"] if isinstance(data, Mapping) else data
    assert results, "no results to check"
    return assert_content(results, prompts, fleet_configs(fleet), sampling=sampling)


def _short(value: Any) -> Any:
    return value[:60] + "…" if isinstance(value, str) and len(value) > 60 else value
