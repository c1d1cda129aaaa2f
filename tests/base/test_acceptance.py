"""fleetgen/base/acceptance.py: the pooled figure is Σ tokens / Σ steps and can order two
drafters unlike the per-request mean (vLLM #42508); the breakdowns, the lowest rows and the
regenerable weak rows."""

from __future__ import annotations

from typing import Any

from fleetgen.base.acceptance import AcceptanceScan, Pool, length_bucket, thinking_of, weak_row


def result(tokens: int, steps: int, **more: Any) -> dict[str, Any]:
    return {"id": more.pop("id", f"r{tokens}-{steps}"), "completion_tokens": tokens,
            "spec": {"verify_ct": steps, "accept_length": tokens / steps}, "line": 0, **more}


def test_pooled_and_mean_can_order_two_drafters_differently() -> None:
    # A: good on short answers, poor on the long one; B: even. The mean prefers A, the
    # pooled figure (what the speed-up follows) prefers B.
    a, b = Pool(), Pool()
    for r in (result(20, 4), result(20, 4), result(2000, 1000)):
        a.add(r)
    for r in (result(20, 8), result(20, 8), result(2000, 800)):
        b.add(r)
    fa, fb = a.figures(), b.figures()
    assert fa["accept_length"] == round(2040 / 1008, 4) < fb["accept_length"] == round(
        2040 / 816, 4)
    assert fa["accept_length_mean"] > fb["accept_length_mean"]


def test_records_without_usable_spec_are_left_out() -> None:
    pool = Pool()
    assert not pool.add({"completion_tokens": 10})
    assert not pool.add({"completion_tokens": 10, "spec": {"verify_ct": 0}})
    assert not pool.add({"completion_tokens": 10, "spec": {"verify_ct": True}})
    assert not pool.add({"completion_tokens": 10, "spec": "x"})
    assert pool.add({"completion_tokens": 10, "spec": {"verify_ct": 5}})
    assert pool.figures()["accept_length"] == 2.0 and pool.figures()["accept_rate"] is None


def test_breakdowns_lowest_rows_and_weak_rows() -> None:
    scan = AcceptanceScan(group_by="source")
    for i in range(30):
        scan.add(result(100, 10 + i, id=f"q{i}", line=i, worker=f"gpu{i % 2}@h",
                        source="code" if i < 10 else "chat", messages=[{"role": "user",
                                                                        "content": str(i)}],
                        reasoning_tokens=i % 3), slot=i)
    figures = scan.figures()
    assert figures is not None
    sources = figures["breakdowns"]["field:source"]
    assert [g["group"] for g in sources] == ["chat", "code"]  # lowest first
    assert sources[1]["accept_length"] == round(1000 / sum(range(10, 20)), 4)
    assert {g["group"] for g in figures["breakdowns"]["thinking"]} == {"on", "off"}
    rows = figures["lowest_rows"]
    assert [r["id"] for r in rows] == [f"q{i}" for i in range(29, 9, -1)]
    assert figures["lowest_groups"][0]["accept_length"] == min(
        g["accept_length"] for groups in figures["breakdowns"].values() if len(groups) > 1
        for g in groups)
    weak = weak_row(scan.lowest_rows()[0])
    assert weak == {"id": "q29", "source": "chat", "messages": [{"role": "user",
                                                                 "content": "29"}]}


def test_thinking_and_length_groups() -> None:
    assert thinking_of({"reasoning_tokens": 0}) == "off"
    assert thinking_of({"chat_template_kwargs": {"enable_thinking": True}}) == "on"
    assert thinking_of({}) == "unknown"
    assert [length_bucket({"completion_tokens": n}) for n in (1, 256, 4095, 9000)] == [
        "0-255", "256-1023", "1024-4095", "4096+"]
