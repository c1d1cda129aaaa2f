"""A whole run on llama.cpp: the producer reads the slot context from llama-server's /props,
real Celery workers speak the OpenAI protocol to it, the drainer writes every row once.

Prompts are built to exact token counts around the slot context, so the length rule is met at
its edge: n_ctx - 1 tokens (1 left), a few under, n_ctx (rejected before sending)."""

from __future__ import annotations

import json
from pathlib import Path

from fleetgen.local.fleet import LocalFleet
from tests.support.llama import LlamaServer
from tests.support.pipeline import (
    assert_exactly_once,
    make_prompts,
    row_of,
    run_pipeline,
)

OVER_LIMIT = "exceeds the available context size"  # llama.cpp's log line for the 400


def prompts_around(path: Path, n_ctx: int, sizes: dict[str, int], ordinary: int) -> set[str]:
    """`ordinary` varied rows from the e2e generator, plus rows of the given exact sizes."""
    kinds = make_prompts(path, ordinary, seed=5)
    with path.open("a") as f:
        for row_id, tokens in sizes.items():
            f.write(json.dumps(row_of(tokens, row_id)) + "\n")
    return set(kinds["good"]) | set(sizes)


def server_refusals(llama: LlamaServer, offset: int) -> int:
    return llama.log_text(offset).count(OVER_LIMIT)


def test_a_run_on_llama_cpp_keeps_its_length_rule(
        llama: LlamaServer, llama_fleet: LocalFleet, tmp_path: Path) -> None:
    n_ctx = 4096
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    edge = {"edge-1": n_ctx - 1, "edge-3": n_ctx - 3, "edge-12": n_ctx - 12,
            "edge-40": n_ctx - 40}
    expected = prompts_around(prompts, n_ctx, {**edge, "at-limit": n_ctx}, ordinary=24)
    log_offset = len(llama.log_text())
    summary = run_pipeline(llama_fleet, prompts, "llama", out, timeout_s=240,
                           context_length=None, engine_url=(llama.url,),
                           engine_protocol="openai", max_output_tokens=16,
                           min_output_tokens=1)
    data = assert_exactly_once(out, expected)
    assert summary["failed"] == 0 and not data["failures"], data["failures"][:3]
    # Refused by the producer, never sent: the prompt of n_ctx tokens.
    assert [(r["id"], r["reason"].split(":")[0]) for r in data["rejected"]] == [
        ("at-limit", "prompt_too_long")]
    results = {r["id"]: r for r in data["results"]}
    for row_id, r in results.items():
        assert r["max_tokens"] == min(16, n_ctx - r["prompt_tokens"]), row_id
        assert r["attempts"] == 1, row_id
        assert r["completion_tokens"] <= r["max_tokens"], row_id
    for row_id, tokens in edge.items():
        r = results[row_id]
        assert r["prompt_tokens"] == tokens, row_id
        if n_ctx - tokens < 16:  # the whole rest of the context, and all of it generated
            assert r["finish_reason"] == "length" and r["completion_tokens"] == n_ctx - tokens
    assert server_refusals(llama, log_offset) == 0


def test_a_producer_told_a_larger_context_meets_llama_cpps_own_limit(
        llama: LlamaServer, llama_fleet: LocalFleet, tmp_path: Path) -> None:
    # --context-length 16384 without --engine-url: the producer believes four times the slot.
    # llama.cpp never refuses a max_tokens larger than the room: it stops at n_ctx - prompt
    # ("length"). It refuses (400 with n_prompt_tokens >= n_ctx) only a prompt that does not
    # fit at all, and that has nothing to correct: one attempt, a context_length failure.
    n_ctx = 4096
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    sizes = {"near-5": n_ctx - 5, "over": n_ctx + 100}
    expected = prompts_around(prompts, n_ctx, sizes, ordinary=8)
    log_offset = len(llama.log_text())
    summary = run_pipeline(llama_fleet, prompts, "wrongctx", out, timeout_s=240,
                           context_length=16384, engine_protocol="openai",
                           max_output_tokens=16, min_output_tokens=1)
    data = assert_exactly_once(out, expected)
    assert not data["rejected"]
    failures = {f["id"]: f for f in data["failures"]}
    assert set(failures) == {"over"} and summary["failed"] == 1
    over = failures["over"]
    assert over["error"]["type"] == "context_length" and over["error"]["status"] == 400
    assert over["attempts"] == 1 and over["prompt_tokens"] == n_ctx + 100
    near = next(r for r in data["results"] if r["id"] == "near-5")
    assert near["max_tokens"] == 16 and near["attempts"] == 1
    assert near["finish_reason"] == "length" and near["completion_tokens"] == 5
    assert server_refusals(llama, log_offset) == 1
