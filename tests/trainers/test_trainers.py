"""The drafter trainers' own code judges fleetgen's exports of real CLI runs: SpecForge 0.2.0
(`prepare_prompt_tasks` as `prompts_path` and `train_data_path` read it, `chat_template:
qwen3.5`, with and without `train_only_last_turn`) and speculators 0.9.0
(`load_and_preprocess_dataset`), with the Qwen3.6 tokenizer, on three runs of simulated
thinking-model servers (tests/support/trainer_runs.py): single turns (system turns, rows that turn
thinking off, raw prompts, the dataset's own history answers, cut answers), `--turns all` with
`--n 2`, and `--turns all` with `preserve_thinking`.

For every generated answer: the trainer's input ids must be the prompt the model was sent
followed by the ids it returned, and its loss mask must cover exactly those ids
(tests/support/trainer_verdict.py). Where a trainer cannot by its own rules, the limit is
pinned with its figure (docs/training.md lists them all)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetgen.local.fleet import LocalFleet
from tests.support.cli import fleetgen
from tests.support.content import tokenizer
from tests.support.fleet import started_fleet
from tests.support.trainer_judge import run_judge
from tests.support.trainer_runs import RUNS, Answer, Run, answers, produce
from tests.support.trainer_verdict import Verdict, judge

# The module's fixture runs three CLI runs and one judge process for every trainer job: about
# 3 minutes on 2 quiet cores, over 5 under the suite's other xdist processes (the 300 s
# default timed out once so); its first test carries that time.
pytestmark = pytest.mark.timeout(900)


@dataclass
class Judged:
    runs: dict[str, Run]
    answers: dict[str, list[Answer]]  # run -> every answer it generated
    outs: dict[str, Path]
    verdicts: dict[str, Verdict]  # job name -> what the trainer did with its answers
    errors: dict[str, str]  # job name -> the trainer's refusal


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    # Reasoning and answer are each about 40 tokens: under a 64-token budget some answers
    # finish, some are cut in the answer (length) and some inside the reasoning.
    yield from started_fleet(tmp_path_factory.mktemp("trainers-fleet"), gpus=2,
                             output_tokens_mean=40, sim_args=["--thinking"])


def export(out: Path, fmt: str, target: Path, *extra: str) -> Path:
    fleetgen("export", str(out), "--format", fmt, "--out", str(target), *extra)
    return target


def jobs_for(name: str, out: Path, work: Path, render: str) -> dict[str, dict[str, Any]]:
    """The trainer jobs on one run's exports: job name -> job."""
    tok = str(tokenizer().cache_path)  # type: ignore[union-attr]
    tokens = export(out, "tokens", work / f"{name}.tokens.jsonl")
    everything = export(out, "tokens", work / f"{name}.all.tokens.jsonl", "--include-unfinished")
    conv = export(out, "conversations", work / f"{name}.conversations.jsonl")
    jobs = {
        f"{name}/tokens/specforge": {"trainer": "specforge", "path": str(tokens)},
        f"{name}/tokens/speculators": {"trainer": "speculators", "path": str(tokens)},
        # SpecForge's pre-tokenized path is the standard library's: no dataset is built.
        f"{name}/tokens+unfinished/specforge": {"trainer": "specforge",
                                                "path": str(everything)},
        f"{name}/conversations/specforge": {"trainer": "specforge", "path": str(conv)},
        f"{name}/conversations/specforge-last-turn": {"trainer": "specforge",
                                                      "path": str(conv),
                                                      "train_only_last_turn": True},
        f"{name}/conversations/speculators": {"trainer": "speculators", "path": str(conv),
                                              "render_endpoint": render},
    }
    if name == "single":
        for fmt in ("tokens", "conversations"):
            table = export(out, fmt, work / f"{name}.{fmt}.parquet")
            jobs[f"{name}/{fmt}.parquet/specforge"] = {"trainer": "specforge",
                                                      "path": str(table)}
            jobs[f"{name}/{fmt}.parquet/speculators"] = {"trainer": "speculators",
                                                        "path": str(table)}
    for job in jobs.values():
        job["tokenizer_dir"] = tok
    return jobs


@pytest.fixture(scope="module")
def judged(fleet: LocalFleet, render_endpoint: str,
           tmp_path_factory: pytest.TempPathFactory) -> Judged:
    work = tmp_path_factory.mktemp("trainers")
    runs = {run.name: run for run in RUNS}
    outs = {name: produce(fleet, run, work) for name, run in runs.items()}
    generated = {name: answers(runs[name], out) for name, out in outs.items()}
    jobs: dict[str, dict[str, Any]] = {}
    for name, out in outs.items():
        jobs.update(jobs_for(name, out, work, render_endpoint))
    results = dict(zip(jobs, run_judge(list(jobs.values()), work), strict=True))
    verdicts: dict[str, Verdict] = {}
    errors: dict[str, str] = {}
    for job, result in results.items():
        if "error" in result:
            errors[job] = result["error"]
            continue
        verdicts[job] = judge(generated[job.split("/")[0]], result["rows"])
    figures = {job: v.figures() for job, v in verdicts.items()}
    (work / "figures.json").write_text(json.dumps({"figures": figures, "errors": errors},
                                                  indent=1))
    print(json.dumps({"figures": figures, "errors": errors}, indent=1))
    return Judged(runs, generated, outs, verdicts, errors)


SPECFORGE_NO_THINKING_EARLY = 2  # `</think>`, `\n\n`: its forced think header ends before them
SPECULATORS_NO_THINKING_EARLY = 3  # `\n`, `</think>`, `\n\n`: it renders with thinking on
TAIL = 1  # the `\n` Qwen's template writes after `<|im_end|>`: one token past the model's stop


def expected(judged: Judged, run: str, conversations: bool = False) -> list[Answer]:
    """The answers an export holds by default: the finished ones; of the conversations
    export, those a trainer renders (a raw prompt has no conversation to render)."""
    raw = {row["id"] for row in judged.runs[run].rows if "prompt" in row}
    return [a for a in judged.answers[run]
            if a.finished and not (conversations and a.record["id"] in raw)]


def keys(found: list[Answer]) -> set[str]:
    return {a.key for a in found}


@pytest.mark.parametrize("run", [run.name for run in RUNS])
@pytest.mark.parametrize("trainer", ["specforge", "speculators"])
def test_tokens_export_is_exact_for_both_trainers(judged: Judged, run: str,
                                                  trainer: str) -> None:
    """SpecForge `prompts_path`, speculators' pre-tokenized rows: every finished answer once,
    its prompt as sent and its ids as returned, the mask over exactly those ids."""
    verdict = judged.verdicts[f"{run}/tokens/{trainer}"]
    want = keys(expected(judged, run))
    assert set(verdict.trained) == want and verdict.exact == want
    assert verdict.duplicated == verdict.unmatched == verdict.tail_supervised == 0
    assert sum(verdict.context_supervised.values()) == 0
    assert len(want) < len(judged.answers[run])  # each run has unfinished answers


@pytest.mark.parametrize("run", [run.name for run in RUNS])
def test_include_unfinished_keeps_every_answer_exact(judged: Judged, run: str) -> None:
    verdict = judged.verdicts[f"{run}/tokens+unfinished/specforge"]
    assert verdict.exact == set(verdict.trained) == keys(judged.answers[run])
    assert verdict.unmatched == verdict.tail_supervised == 0


@pytest.mark.parametrize("run", [run.name for run in RUNS])
def test_conversations_train_every_answer_as_sent_in_specforge(judged: Judged,
                                                              run: str) -> None:
    """`train_data_path` with `train_only_last_turn: true` (docs/training.md): every finished answer
    once, in the context it was sent (the row's template options, preserve_thinking
    included, reach the template as columns), raw prompts skipped. SpecForge's own limits,
    pinned: its parser forces enable_thinking, so a no-thinking answer's mask starts 2
    template tokens early; and it supervises the `\n` after `<|im_end|>`."""
    verdict = judged.verdicts[f"{run}/conversations/specforge-last-turn"]
    want = expected(judged, run, conversations=True)
    assert set(verdict.trained) == keys(want)
    assert verdict.duplicated == verdict.unmatched == 0
    thinking = {a.key for a in want if a.thought}
    assert verdict.exact == thinking and thinking and thinking != keys(want)
    assert {k: n for k, n in verdict.context_supervised.items() if n} == {
        a.key: SPECFORGE_NO_THINKING_EARLY for a in want if not a.thought}
    assert verdict.tail_supervised == TAIL * len(want)
    assert verdict.trained_tokens == sum(len(a.output_ids) for a in want)


@pytest.mark.parametrize("run", [run.name for run in RUNS])
def test_specforge_default_supervises_preserved_history_again(judged: Judged,
                                                              run: str) -> None:
    """SpecForge's default `train_only_last_turn: false`: a history answer rendered with its
    think block (every one under preserve_thinking) matches its assistant pattern, so each
    turn's row trains the turns before it again; without preserve_thinking Qwen3.6 drops
    history reasoning and the default trains as `true` does."""
    default = judged.verdicts[f"{run}/conversations/specforge"]
    last = judged.verdicts[f"{run}/conversations/specforge-last-turn"]
    assert set(default.trained) == set(last.trained) and default.unmatched == 0
    again = {k: default.context_supervised[k] - last.context_supervised[k]
             for k in default.trained}
    later = {a.key for a in expected(judged, run, True) if int(a.record.get("turn") or 1) > 1}
    if judged.runs[run].kwargs.get("preserve_thinking"):
        assert {k for k, n in again.items() if n} == later and later
    else:
        assert not any(again.values()) and default.exact == last.exact


def test_speculators_conversation_path_limits(judged: Judged) -> None:
    """speculators renders conversations through vLLM's /render with no template options
    and trains every assistant turn of a line: its limits on the conversations export,
    pinned (the tokens export has none of them). A no-thinking answer's mask starts 3
    tokens early; the dataset's own history answers (marked `generated: false`) are trained
    as rows that are no answer of the run; a `--turns all` turn's line trains every earlier
    turn again; under preserve_thinking no later turn is rendered as it was sent."""
    single = judged.verdicts["single/conversations/speculators"]
    want = expected(judged, "single", conversations=True)
    assert set(single.trained) == keys(want) and single.duplicated == 0
    assert {k: n for k, n in single.context_supervised.items() if n} == {
        a.key: SPECULATORS_NO_THINKING_EARLY for a in want if not a.thought}
    history = [a for a in want if a.record["id"].startswith(("hist", "gpt"))]
    assert single.unmatched == len(history) > 0

    multi = judged.verdicts["multi/conversations/speculators"]
    assert multi.duplicated > 0 and keys(expected(judged, "multi", True)) <= set(multi.trained)

    preserve = judged.verdicts["preserve/conversations/speculators"]
    later = {a.key for a in expected(judged, "preserve", True)
             if int(a.record.get("turn") or 1) > 1}
    assert later and not later & set(preserve.trained)


@pytest.mark.parametrize("fmt", ["tokens", "conversations"])
def test_neither_trainer_reads_parquet(judged: Judged, fmt: str) -> None:
    """The Parquet twins are for datasets and pandas; the trainers read JSONL only."""
    assert judged.errors[f"single/{fmt}.parquet/specforge"].startswith("UnicodeDecodeError")
    assert judged.errors[f"single/{fmt}.parquet/speculators"].startswith(
        "ValueError: Unsupported dataset")
    assert set(judged.errors) == {f"single/{f}.parquet/{t}" for f in ("tokens", "conversations")
                                  for t in ("specforge", "speculators")}
