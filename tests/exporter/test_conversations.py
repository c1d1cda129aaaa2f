"""`fleetgen export --format conversations`: every result as its conversation plus the answer,
in input order, as SpecForge's `conversations` of role/content turns whatever the input's turn
style, with reasoning kept, inlined or stripped; the template options and whether the model
thought on every line; raw prompts with no conversation; the dataset's own answers marked;
unfinished answers left out unless `--include-unfinished`; the Parquet twin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from fleetgen import exitcodes
from fleetgen.exporter import shape
from producer.conversation import SHAREGPT_ROLES
from tests.support.cli import Export
from tests.support.outdir import MESSAGES_1, SYSTEM, read_jsonl, result, without_nulls


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str, **extra: str) -> dict[str, str]:
    return {"role": "assistant", "content": text, **extra}


def expected(reasoning: str, unfinished: bool = False) -> list[dict[str, Any]]:
    """The export of tests/support/outdir.py, line by line, written out by hand: every row a
    `conversations` of role/content turns, whatever the input's shape (a raw prompt: none),
    the template options it was rendered with, whether it thought where the record says, and
    status success; the answer cut at its budget only with `unfinished` (--include-unfinished),
    marked."""
    def thought(answer: str, why: str) -> dict[str, str]:
        if reasoning == "keep":
            return {"content": answer, "reasoning_content": why}
        if reasoning == "inline":
            return {"content": f"<think>\n{why}\n</think>\n\n{answer}"}
        return {"content": answer}

    def row(row_id: str, turns: list[dict[str, Any]] | None, **fields: Any) -> dict[str, Any]:
        status = {"status": "unfinished", "unfinished": "length"} \
            if fields["finish_reason"] == "length" else {"status": "success"}
        fields = {"chat_template_kwargs": {}, **fields}
        return {"id": row_id, "conversations": turns, **fields, **status}

    def raw(row_id: str, prompt: str, completion: str) -> dict[str, Any]:
        return {"id": row_id, "conversations": None, "prompt": prompt, "completion": completion,
                "chat_template_kwargs": {}, "finish_reason": "stop", "status": "success"}

    return [
        row("a", [SYSTEM, user("Name a prime."), assistant("7.")],
            source="mix-v2", tags=["math", "short"], finish_reason="stop"),
        row("b", [user("What is 2+2?"), {**assistant("5"), "generated": False},
                  user("Check again, 数据 😀."),
                  {"role": "assistant", **thought("It is 4.", "2+2 is 4, not 5.")}],
            source="sharegpt", chat_template_kwargs={}, thinking=True, finish_reason="stop"),
        *([row("c", [user("Write a long poem."), assistant("Roses are")],
               finish_reason="length")] if unfinished else []),
        raw("d", "The capital of France is", " Paris."),
        *[row("i", [user("Pick a colour."),
                    {"role": "assistant", **thought(f"colour {s}", f"thinking {s}")}],
              sample=s, chat_template_kwargs={}, thinking=True, finish_reason="stop")
          for s in range(3)],
        row("j", [user("Pick a number."), assistant("42")], sample=0, finish_reason="stop"),
        row("req-11", [user("Hi!"), assistant("Hello!")], finish_reason="stop"),
        raw("req-12", "Once upon a time", " there was"),
        row("n", [user("Retry me."), assistant("Done.")], finish_reason="stop"),
    ]


@pytest.mark.parametrize("reasoning", ["keep", "inline", "strip"])
def test_every_result_becomes_its_conversation_with_the_answer(
        reasoning: str, export: Export, drained: Path) -> None:
    ran = export(drained, "--format", "conversations", "--reasoning", reasoning)
    assert ran.code == 0, ran.err
    out = drained / "export.conversations.jsonl"
    assert ran.out.strip() == (f"fleetgen export: 10 lines of run 'exp-fixture' -> {out}; "
                               "left out 1 unfinished (1 length)")
    assert read_jsonl(out) == expected(reasoning)
    ran = export(drained, "--format", "conversations", "--reasoning", reasoning,
                 "--include-unfinished")
    assert ran.out.strip() == f"fleetgen export: 11 lines of run 'exp-fixture' -> {out}"
    assert read_jsonl(out) == expected(reasoning, unfinished=True)


def test_keep_is_the_default_and_the_id_comes_first(export: Export, drained: Path,
                                                   tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "sft.jsonl"
    assert export(drained, "--format", "conversations", "--out", target).code == 0
    assert read_jsonl(target) == expected("keep")
    first = target.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith('{"id":"a","conversations":[{"role":"system"')
    assert not (drained / "export.conversations.jsonl").exists()
    assert MESSAGES_1[-1]["role"] == "assistant"  # the fixture's trailing answer was dropped


def test_an_answer_cut_off_inside_its_reasoning_keeps_the_block_open(
        export: Export, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / ".fleetgen-run").write_text("cut\n")
    record = result({"messages": [user("Think hard.")]}, "t", 1, "", finish="length",
                    reasoning="step 1, step 2", reasoning_unfinished=True)
    (out / "results.jsonl").write_bytes(orjson.dumps(record) + b"\n")
    (out / "summary.json").write_bytes(orjson.dumps({"complete": True, "finished_at": 1.0}))
    assert export(out, "--format", "conversations", "--reasoning", "inline",
                  "--include-unfinished").code == 0
    (row,) = read_jsonl(out / "export.conversations.jsonl")
    assert row["conversations"][-1] == assistant("<think>\nstep 1, step 2")
    assert (row["status"], row["unfinished"], row["thinking"]) == (
        "unfinished", "reasoning_unfinished", True)
    assert export(out, "--format", "conversations", "--include-unfinished").code == 0
    (row,) = read_jsonl(out / "export.conversations.jsonl")
    assert row["conversations"][-1] == assistant("", reasoning_content="step 1, step 2")


def test_a_rows_fields_named_like_fleetgens_are_the_rows_not_the_answers(
        export: Export, tmp_path: Path) -> None:
    """A dataset row's own `reasoning`, `completion` and `turn` (kept under `shadowed` in the
    result: tests/records/test_outcomes.py) are columns of the row, never the model's reasoning
    or a turn of `--turns all`; the results table keeps them as the result line has them."""
    out = tmp_path / "out"
    own = {"reasoning": "the dataset's", "completion": "a reference", "turn": 3}
    write_answers(out, [result({"messages": [user("Go on.")], **own}, "r", 1, "Done.")])
    assert export(out, "--format", "conversations").code == 0
    (row,) = read_jsonl(out / "export.conversations.jsonl")
    assert row["conversations"] == [user("Go on."), assistant("Done.")]
    assert "thinking" not in row and {k: row[k] for k in own} == own
    assert export(out, "--format", "parquet").code == 0
    (table,) = pq.read_table(out / "export.parquet").to_pylist()
    assert (table["completion"], table["shadowed"]) == ("Done.", own) and "reasoning" not in table


def test_the_sharegpt_speakers_are_the_producers() -> None:
    """The exporter drops the trailing answers the producer dropped and names each speaker's
    role as the producer read it: the same table."""
    assert shape.SHAREGPT_ROLES == SHAREGPT_ROLES
    assert {k for k, v in SHAREGPT_ROLES.items() if v == "assistant"} == \
        shape.SHAREGPT_ASSISTANT


def write_answers(out: Path, records: list[dict[str, Any]]) -> Path:
    out.mkdir()
    (out / ".fleetgen-run").write_text("finish\n")
    (out / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    (out / "summary.json").write_bytes(orjson.dumps({"complete": True, "finished_at": 1.0}))
    return out


def answers() -> list[dict[str, Any]]:
    """One answer of each kind, in input order: whole, cut at its budget, cut inside its
    reasoning, stopped inside its reasoning, empty, whole with its reasoning."""
    ask = {"messages": [user("Go on.")]}
    return [
        result(ask, "whole", 1, "Done."),
        result(ask, "cut", 2, "Half a", finish="length"),
        result(ask, "cut-thinking", 3, "", finish="length", reasoning="step 1",
               reasoning_unfinished=True),
        result(ask, "stopped-thinking", 4, "", reasoning="step 1, then",
               reasoning_unfinished=True),
        result(ask, "empty", 5, "  \n"),
        result(ask, "thought", 6, "Yes.", reasoning="so yes", reasoning_unfinished=False),
    ]


@pytest.mark.parametrize("flags", [(), ("--only-finished",)], ids=["default", "only-finished"])
def test_unfinished_answers_are_left_out_and_counted_unless_included(
        export: Export, tmp_path: Path, flags: tuple[str, ...]) -> None:
    out = write_answers(tmp_path / "out", answers())
    target = out / "export.conversations.jsonl"
    ran = export(out, "--format", "conversations", *flags)
    assert ran.code == 0, ran.err
    assert ran.out.strip() == (
        f"fleetgen export: 2 lines of run 'finish' -> {target}; left out 4 unfinished "
        "(2 reasoning_unfinished, 1 length, 1 empty)")
    rows = read_jsonl(target)
    assert [r["id"] for r in rows] == ["whole", "thought"]
    assert rows[1]["conversations"] == [
        user("Go on."), assistant("Yes.", reasoning_content="so yes")]
    ran = export(out, "--format", "conversations", "--include-unfinished")  # every answer
    assert ran.out.strip() == f"fleetgen export: 6 lines of run 'finish' -> {target}"
    kept = read_jsonl(target)
    assert [(r["status"], r.get("unfinished")) for r in kept] == [
        ("success", None), ("unfinished", "length"), ("unfinished", "reasoning_unfinished"),
        ("unfinished", "reasoning_unfinished"), ("unfinished", "empty"), ("success", None)]


def test_include_unfinished_is_refused_where_it_means_nothing(export: Export,
                                                             drained: Path) -> None:
    for flags, said in ((("--format", "parquet"), "--include-unfinished applies to --format "
                         "conversations and tokens"),
                        (("--format", "conversations", "--only-finished"), "contradict")):
        ran = export(drained, *flags, "--include-unfinished")
        assert ran.code == exitcodes.CONFIG and said in ran.err, ran.err


def test_only_finished_on_the_fixture_and_on_the_results_table(
        export: Export, drained: Path) -> None:
    ran = export(drained, "--format", "conversations", "--only-finished")
    assert ran.code == 0, ran.err
    assert ran.out.strip().endswith("; left out 1 unfinished (1 length)")
    assert read_jsonl(drained / "export.conversations.jsonl") == [
        r for r in expected("keep") if r["id"] != "c"]
    ran = export(drained, "--format", "parquet", "--only-finished")
    assert ran.code == 0, ran.err
    table = pq.read_table(drained / "export.parquet")
    assert "c" not in table.column("id").to_pylist() and table.num_rows == 10
    assert ran.out.strip().endswith("; left out 1 unfinished (1 length)")


def test_only_finished_is_refused_for_openai_batch(export: Export, drained: Path) -> None:
    ran = export(drained, "--format", "openai-batch", "--only-finished")
    assert ran.code == exitcodes.CONFIG
    assert "--only-finished does not apply to --format openai-batch" in ran.err
    assert not (drained / "export.openai-batch.jsonl").exists()


def test_an_out_ending_in_parquet_writes_the_conversations_as_a_table(
        export: Export, drained: Path, tmp_path: Path) -> None:
    target = tmp_path / "train.parquet"
    ran = export(drained, "--format", "conversations", "--out", target)
    assert ran.code == 0, ran.err
    assert ran.out.strip() == (f"fleetgen export: 10 rows of run 'exp-fixture' -> {target}; "
                               "left out 1 unfinished (1 length)")
    table = pq.read_table(target)
    assert table.schema.names[:2] == ["id", "conversations"]
    turn = table.schema.field("conversations").type.value_type
    assert {turn.field(i).name for i in range(turn.num_fields)} == {
        "role", "content", "reasoning_content", "generated"}
    # An empty struct cannot be a Parquet column: options left empty are left out of the twin.
    assert [without_nulls(r) for r in table.to_pylist()] == [
        {k: v for k, v in r.items() if v != {}} for r in without_nulls(expected("keep"))]
    ran = export(drained, "--format", "conversations", "--include-unfinished", "--out", target)
    assert ran.code == 0 and pq.read_table(target).num_rows == 11
