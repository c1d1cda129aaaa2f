"""Content checks: every result row must hold exactly what the simulator answers for its input.

The simulator's answer is a pure function of the input ids, its `--seed`, the request's
`sampling_seed` and the token budget (docs/simulator.md). So for each result row we
re-read the input row, render and tokenize it exactly as the producer does, ask the
simulator's own model what it answers under the row's `max_tokens`, and compare
`completion`, `completion_tokens`, `finish_reason` and `prompt_tokens`. A row attached to
the wrong prompt, a completion cut or duplicated, a budget that is not the one sent, or a
prompt rendered differently from what the producer sent fails here.

With the issue-12 options (`options`: the payload's `think`, `think_open`, `json_schema`,
`logprobs`, `token_ids`) the reasoning split, `reasoning_tokens`, `json_valid`, the compact
logprobs and the output ids are recomputed too, from the simulator's own token structure
(fleetgen/simulator/answers.py): the reasoning is the tokens before `</think>`, not a re-run of
fleetgen's split.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema

from fleetgen.local.fleet import LocalFleet
from fleetgen.local.simgpus import SimGpus
from fleetgen.simulator.answers import (
    THINK_END_ID,
    Opening,
    Style,
    breaks_json,
    compose,
    opening,
    reasons,
    token_logprobs,
)
from fleetgen.simulator.cli import add_arguments, config_from_args
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.model import STOP_TOKEN_ID, Completion, request_key
from fleetgen.simulator.request import schedule_limit, vllm_limit
from producer.request import sample_seed
from producer.rows import Row, read_rows
from producer.tokenizer import PromptTokenizer, load_tokenizer

CHECKED = ("completion", "completion_tokens", "finish_reason", "prompt_tokens")
REQUIRED = ("id", "line", "worker", "max_tokens", *CHECKED)

# The worker's name ("gpu2@host") -> the simulator config that served it.
ConfigFor = Callable[[str], SimConfig]


@functools.lru_cache(maxsize=4)
def tokenizer(name: str = "qwen3.6", template_kwargs: str = "{}") -> PromptTokenizer:
    """`template_kwargs`: the chat template's options as JSON (hashable, for the cache)."""
    return load_tokenizer(name, chat_template_kwargs=json.loads(template_kwargs))


def input_rows(prompts: Path, wanted: set[str], tokenizer_name: str = "qwen3.6",
               template_kwargs: str = "{}") -> dict[str, tuple[list[int], Row]]:
    """Row id -> the token ids the producer sends for it (render with the chat template
    unless the row is a plain `prompt`, then tokenize; producer/prompts.py) and the row, for
    the first row with each wanted id (the first occurrence wins, as in the producer); a
    row's own `chat_template_kwargs` go over `template_kwargs`."""
    tok = tokenizer(tokenizer_name, template_kwargs)
    rows: list[Row] = []
    seen: set[str] = set()
    for row in read_rows(prompts):
        if row.id in wanted and row.id not in seen:
            seen.add(row.id)
            if isinstance(row, Row):
                rows.append(row)
    texts = [r.prompt if r.prompt is not None else tok.render(r.messages or [], r.template_kwargs)
             for r in rows]
    ids = tok.encode_batch(texts) if texts else []
    return {row.id: (row_ids, row) for row, row_ids in zip(rows, ids, strict=True)}


def splits(tokenizer_name: str) -> bool:
    return len(tokenizer(tokenizer_name).encode_batch(["</think>"])[0]) == 1


def input_ids(prompts: Path, wanted: set[str],
              tokenizer_name: str = "qwen3.6") -> dict[str, list[int]]:
    return {key: ids for key, (ids, _) in input_rows(prompts, wanted, tokenizer_name).items()}


def sim_config(argv: Iterable[str]) -> SimConfig:
    """The SimConfig a `python -m fleetgen.simulator` command line builds
    (fleetgen/simulator/cli.py)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def fleet_configs(fleet: LocalFleet | SimGpus) -> ConfigFor:
    """Per GPU, the config of the simulator started for it (its own flags): a fleet's
    simulated GPUs, or ones never started that name the config of servers started apart."""
    sims = fleet if isinstance(fleet, SimGpus) else fleet.servers
    assert isinstance(sims, SimGpus), sims
    configs: dict[str, SimConfig] = {}
    for gpu in range(sims.gpus):
        argv = sims.argv(1, sims.gpu_sim_args.get(gpu, []))
        configs[f"gpu{gpu}"] = sim_config(argv[argv.index("fleetgen.simulator") + 1:])

    def config_for(worker: str) -> SimConfig:
        return configs[worker.split("@")[0]]

    return config_for


def expected(ids: list[int], max_tokens: int, config: SimConfig,
             sampling: Mapping[str, Any], options: Mapping[str, Any] | None = None,
             ) -> dict[str, Any]:
    """What the simulator answers for these ids under this budget (fleetgen/simulator/request.py
    `build_job` and `style_of`, fleetgen/simulator/scheduler.py `_answer`), as a result record
    holds it."""
    options = options or {}
    prompt_tokens = len(ids) + config.extra_prompt_tokens
    max_new = vllm_limit(prompt_tokens, max_tokens, config) if config.flavor == "vllm" \
        else schedule_limit(prompt_tokens, max_tokens, config)
    key = request_key(config.seed, ids, 0, sampling.get("seed"))
    style = sim_style(key, config, options, ids, sampling)
    answer = compose(key, config.output_tokens_mean, max_new, ids, style)
    want: dict[str, Any] = {
        "completion": answer.text, "completion_tokens": answer.completion_tokens,
        "finish_reason": answer.finish_reason["type"], "prompt_tokens": prompt_tokens}
    if options.get("think"):
        want.update(reasoning_of(answer, reasons(ids, style)))
    if style.schema is not None:
        want["json_valid"] = _valid(want["completion"], style.schema)
    if options.get("token_ids"):
        want["output_ids"] = answer.output_ids
    if options.get("logprobs"):
        scored = token_logprobs(key, answer.output_ids, int(options["logprobs"]))
        want["logprobs"] = {
            "ids": answer.output_ids, "lp": [_round(chosen) for chosen, _ in scored],
            "top_ids": [[token for _, token in top] for _, top in scored],
            "top_lp": [[_round(value) for value, _ in top] for _, top in scored]}
    return want


def sim_style(key: int, config: SimConfig, options: Mapping[str, Any],
              ids: list[int] | None = None, sampling: Mapping[str, Any] | None = None) -> Style:
    """The style fleetgen's request gives the answer: tags kept when thinking, the schema,
    the grammar after the reasoning (SGLang: `require_reasoning`, sent when the prompt left
    the think block open, and honoured with a reasoning parser; vLLM's parser by itself,
    unless the prompt closed the block), the stop strings."""
    think = bool(options.get("think"))
    text = options.get("json_schema")
    schema = None if text is None else json.loads(text)
    parser = config.reasoning_parser is not None
    if config.flavor == "vllm":
        waits = parser and opening(ids or []) is not Opening.ANSWER
    else:
        # The payload's `think_open`, as the producer sets it from the rendered prompt.
        opened = options.get("think_open", opening(ids or []) is Opening.INSIDE)
        waits = parser and think and bool(opened) and schema is not None
    stop = (sampling or {}).get("stop") or ()
    return Style(thinking=config.thinking, schema=schema, reasoning_first=waits,
                 skip_special_tokens=not think,
                 broken_json=schema is not None and breaks_json(key, config.json_invalid_rate),
                 stop=(stop,) if isinstance(stop, str) else tuple(stop),
                 stop_sees_special=config.flavor != "vllm")


def reasoning_of(answer: Completion, reasoned: bool) -> dict[str, Any]:
    """The split of a thinking answer by its tokens: reasoning is every token up to and
    including `</think>` (all of them when the budget ended first)."""
    pieces, ids = list(answer.pieces or answer.token_texts()), answer.output_ids
    if answer.finish_reason.get("matched") == STOP_TOKEN_ID:
        pieces = pieces[:-1]  # the end-of-turn token: in the ids, never in the text
    if not reasoned:
        return {"completion": answer.text, "reasoning": None, "reasoning_tokens": 0,
                "reasoning_unfinished": False}
    end = ids.index(THINK_END_ID) + 1 if THINK_END_ID in ids else None
    if isinstance(answer.finish_reason.get("matched"), str):
        # A stop string: the ids run to its last token, the text stops before its first
        # character. Cut before `</think>`, the answer stopped inside its reasoning.
        text = answer.text
        count = end if end else len(ids)
        if end is None or "</think>" not in text:
            return {"completion": "", "reasoning": text.removeprefix("<think>").strip(),
                    "reasoning_tokens": count, "reasoning_unfinished": True}
        return {"completion": text.split("</think>", 1)[1].lstrip(),
                "reasoning": "".join(pieces[:end - 1]).removeprefix("<think>").strip(),
                "reasoning_tokens": count, "reasoning_unfinished": False}
    thought = "".join(pieces[:end - 1] if end else pieces).removeprefix("<think>").strip()
    rest = "".join(pieces[end:]).lstrip() if end else ""
    return {"completion": rest, "reasoning": thought,
            "reasoning_tokens": end if end else len(ids), "reasoning_unfinished": end is None}


def _valid(text: str, schema: Any) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _round(value: float) -> float:
    return round(value, 3) + 0.0


def row_sampling(row: Mapping[str, Any], sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling options the producer sent for this result: one sample of several has a
    seed of its own (producer/request.py `sample_seed`)."""
    if "sample" not in row:
        return dict(sampling)
    return {**sampling, "seed": sample_seed(row["id"], row["sample"], sampling.get("seed"))}


def assert_content(results: list[dict[str, Any]], prompts: Path,
                   configs: ConfigFor | SimConfig, *,
                   sampling: Mapping[str, Any] | None = None,
                   options: Mapping[str, Any] | None = None,
                   tokenizer_name: str = "qwen3.6",
                   template_kwargs: Mapping[str, Any] | None = None) -> int:
    """Every result row equals the simulator's answer for its input row; returns the count.
    A row's own options (`sampling`, a Batch body's, `json_schema`) go over the run's."""
    config_for: ConfigFor = (configs if callable(configs)
                             else lambda _worker, c=configs: c)  # type: ignore[misc]
    by_id = input_rows(prompts, {str(r.get("id")) for r in results}, tokenizer_name,
                       json.dumps(dict(template_kwargs or {}), sort_keys=True))
    # The producer's default (`--reasoning auto`) splits whenever `</think>` is one token of
    # the vocabulary (producer/request.py `_wants_split`): a test that says nothing expects it.
    options = {"think": splits(tokenizer_name), **(options or {})}
    bad: list[str] = []
    for row in results:
        nulls = [name for name in REQUIRED if row.get(name) is None]
        if nulls:
            bad.append(f"{row.get('id')!r}: null or missing {nulls}")
            continue
        if row["id"] not in by_id:
            bad.append(f"{row['id']!r}: no such input row")
            continue
        ids, source = by_id[row["id"]]
        row_options = dict(options or {})
        if source.json_schema is not None and options is not None:
            row_options["json_schema"] = source.json_schema
        want = expected(ids, row["max_tokens"], config_for(row["worker"]),
                        row_sampling(row, {**(sampling or {}), **source.sampling}),
                        row_options)
        got = {name: row.get(name) for name in want}
        if got != want:
            diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
            bad.append(f"{row['id']!r} (from {row['worker']}): got/expected "
                       f"{ {k: _short(v) for k, v in diff.items()} }")
    assert not bad, f"{len(bad)} of {len(results)} results differ from the simulator's " \
                    f"answer:\n" + "\n".join(bad[:10])
    return len(results)


def assert_fleet_content(fleet: LocalFleet | SimGpus, prompts: Path, data: Mapping[str, Any], *,
                         sampling: Mapping[str, Any] | None = None,
                         options: Mapping[str, Any] | None = None,
                         template_kwargs: Mapping[str, Any] | None = None) -> int:
    """assert_content for the output of a LocalFleet's simulated GPUs, or of these ones
    (read_output's dict or a results list); fails if there is nothing to check."""
    results = data["results"] if isinstance(data, Mapping) else data
    assert results, "no results to check"
    return assert_content(results, prompts, fleet_configs(fleet), sampling=sampling,
                          options=options, template_kwargs=template_kwargs)


def _short(value: Any) -> Any:
    return value[:60] + "…" if isinstance(value, str) and len(value) > 60 else value
