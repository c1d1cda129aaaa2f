"""`fleetgen export --format openai-batch`: one line per input line, in input order, shaped as
OpenAI's and vLLM's batch output; samples are choices; failures and rejections error lines."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from tests.support.cli import Export
from tests.support.outdir import FINISHED_AT, RUN, read_jsonl, write_output_dir

CREATED = int(FINISHED_AT)


def digest(line: int, custom_id: str) -> str:
    """The documented stable id: the run, the input line and the custom_id."""
    return hashlib.blake2b(f"{RUN}\0{line}\0{custom_id}".encode(), digest_size=12).hexdigest()


def ok(line: int, custom_id: str, *, chat: bool, choices: list[dict[str, Any]],
       usage: dict[str, Any], model: str = "fleetgen") -> dict[str, Any]:
    d = digest(line, custom_id)
    return {"id": f"batch_req_{d}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": f"req_{d}", "body": {
                "id": f"{'chatcmpl' if chat else 'cmpl'}-{d}",
                "object": "chat.completion" if chat else "text_completion",
                "created": CREATED, "model": model, "choices": choices, "usage": usage}},
            "error": None}


def failed(line: int, custom_id: str, status: int | None, code: str,
           message: str) -> dict[str, Any]:
    d = digest(line, custom_id)
    return {"id": f"batch_req_{d}", "custom_id": custom_id,
            "response": None if status is None else {
                "status_code": status, "request_id": f"req_{d}", "body": None},
            "error": {"code": code, "message": message}}


def chat(content: str, *, index: int = 0, finish: str = "stop", logprobs: Any = None,
         **message: str) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": content, **message},
            "logprobs": logprobs, "finish_reason": finish}


def usage(prompt: int, completion: int, reasoning: int | None = None) -> dict[str, Any]:
    counts: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                              "total_tokens": prompt + completion}
    if reasoning is not None:
        counts["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return counts


def lp(token: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, Any]:
    return {"token": f"token_id:{token}", "logprob": logprob, "bytes": None,
            "top_logprobs": [{"token": f"token_id:{t}", "logprob": v, "bytes": None}
                             for t, v in top]}


SAMPLE_LOGPROBS = [
    {"content": [lp(11, -0.1, [(11, -0.1), (7, -2.5)]),
                 lp(12, -0.25, [(12, -0.25), (9, -1.75)])]},
    {"content": [lp(13, -0.5, [(13, -0.5), (4, -1.0)])]},
    {"content": [lp(14, -0.01, [(14, -0.01)]), lp(15, -0.02, [(15, -0.02)]),
                 lp(16, -0.03, [(16, -0.03)])]},
]


def expected(model: str = "fleetgen", batch_model: str = "qwen3-batch") -> list[dict[str, Any]]:
    """The export of tests/support/outdir.py, line by line, written out by hand."""
    return [
        ok(1, "a", chat=True, choices=[chat("7.")], usage=usage(20, 5), model=model),
        ok(2, "b", chat=True, choices=[chat("It is 4.", reasoning="2+2 is 4, not 5.")],
           usage=usage(20, 15, reasoning=9), model=model),
        ok(3, "c", chat=True, choices=[chat("Roses are", finish="length")],
           usage=usage(20, 1000), model=model),
        ok(4, "d", chat=False, choices=[{"index": 0, "text": " Paris.", "logprobs": None,
                                         "finish_reason": "stop"}],
           usage=usage(20, 5), model=model),
        failed(5, "e", 400, "prompt_too_long", "prompt_too_long: 9000 prompt tokens >= 8187"),
        failed(6, "row-0123456789abcdef0123", 400, "invalid_json",
               "invalid_json: unexpected character: line 1 column 13 (char 12)"),
        failed(7, "g", 400, "permanent", "400: the prompt has an image part"),
        failed(8, "h", None, "retryable", "engine timed out after 900 s"),
        ok(9, "i", chat=True, choices=[
            chat(f"colour {s}", index=s, reasoning=f"thinking {s}",
                 logprobs=SAMPLE_LOGPROBS[s]) for s in range(3)],
           usage=usage(20, 2 + 1 + 3, reasoning=3 + 4 + 5), model=model),
        failed(10, "j", 503, "retryable",
               "1 of 2 samples got no answer; sample 1: 503: server overloaded"),
        ok(11, "req-11", chat=True, choices=[chat("Hello!")], usage=usage(9, 2),
           model=batch_model),
        ok(12, "req-12", chat=False, choices=[{
            "index": 0, "text": " there was", "finish_reason": "stop",
            "logprobs": {"tokens": ["token_id:101", "token_id:102"],
                         "token_logprobs": [-0.125, -0.5], "top_logprobs": None,
                         "text_offset": []}}],
           usage=usage(4, 2), model=batch_model),
        failed(13, "a", 400, "duplicate_id", "duplicate_id: an earlier row has the same id"),
        ok(14, "n", chat=True, choices=[chat("Done.")], usage=usage(20, 5), model=model),
    ]


def test_one_line_per_input_line_in_input_order(export: Export, drained: Path) -> None:
    ran = export(drained, "--format", "openai-batch")
    assert ran.code == 0, ran.err
    out = drained / "export.openai-batch.jsonl"
    assert ran.out.strip() == f"fleetgen export: 14 lines of run '{RUN}' -> {out}"
    # Line 14's failure, superseded by its result, is reported and not exported.
    assert "1 failure(s) superseded by a result" in ran.err
    assert read_jsonl(out) == expected()


def test_model_from_the_flag_over_the_summary_over_each_batch_line(
        export: Export, tmp_path: Path) -> None:
    out = write_output_dir(tmp_path / "out")
    summary = orjson.loads((out / "summary.json").read_bytes())
    (out / "summary.json").write_bytes(orjson.dumps({**summary, "model": "Qwen/Qwen3.6"}))
    assert export(out, "--format", "openai-batch").code == 0
    assert read_jsonl(out / "export.openai-batch.jsonl") == expected(
        "Qwen/Qwen3.6", "Qwen/Qwen3.6")
    assert export(out, "--format", "openai-batch", "--model", "mine").code == 0
    assert read_jsonl(out / "export.openai-batch.jsonl") == expected("mine", "mine")


def test_reasoning_strip_and_inline(export: Export, drained: Path) -> None:
    assert export(drained, "--format", "openai-batch", "--reasoning", "strip").code == 0
    lines = read_jsonl(drained / "export.openai-batch.jsonl")
    assert lines[1]["response"]["body"]["choices"] == [chat("It is 4.")]
    assert export(drained, "--format", "openai-batch", "--reasoning", "inline").code == 0
    lines = read_jsonl(drained / "export.openai-batch.jsonl")
    assert lines[1]["response"]["body"]["choices"] == [
        chat("<think>\n2+2 is 4, not 5.\n</think>\n\nIt is 4.")]
    # The counts are facts about the answer, whatever is shown of it.
    assert lines[1]["response"]["body"]["usage"] == usage(20, 15, reasoning=9)


def test_the_export_does_not_depend_on_drain_order(export: Export, tmp_path: Path) -> None:
    """Two drains of the same run interleave their files differently; the export is the same
    file, byte for byte, and so is a second export of the same directory."""
    outputs = []
    for seed in (1, 2):
        out = write_output_dir(tmp_path / f"out{seed}", seed=seed)
        assert (out / "results.jsonl").read_bytes() != (
            tmp_path / "out1" / "results.jsonl").read_bytes() or seed == 1
        for _ in range(2):
            assert export(out, "--format", "openai-batch").code == 0
            outputs.append((out / "export.openai-batch.jsonl").read_bytes())
    assert len(set(outputs)) == 1
