"""fleetgen/drainer/acceptance.py: the pooled figure is Σ tokens / Σ steps and can order two
drafters unlike the per-request mean (vLLM #42508); the breakdowns, the lowest rows and the
regenerable weak rows."""

from __future__ import annotations

from typing import Any

from fleetgen.drainer.acceptance import AcceptanceScan, Pool, length_bucket, thinking_of, weak_row


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
        scan.add(result(100, 10 + i, id=f"q{i}", line=i, worker="gpu0@h",
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


def test_vllm_answers_without_a_verify_step_count_as_one_token_a_step() -> None:
    """vLLM's sampled answers the n-gram never matched: in their group at 1.0 (vLLM's own
    mean for them), not missing from it; the pooled Σ/Σ of the others unchanged."""
    scan = AcceptanceScan(group_by="mode")
    no_step = {"verify_ct": 0, "tokens": 0, "accept_length": 1.0, "correct_drafts": 0}
    loop = {"verify_ct": 10, "tokens": 39, "accept_length": 3.9, "correct_drafts": 29}
    for i in range(10):
        scan.add({"id": f"r{i}", "completion_tokens": 40, "mode": "sampled" if i % 2 else
                  "greedy", "spec": no_step if i % 2 else loop}, slot=i)
    figures = scan.figures()
    assert figures is not None
    assert figures["requests"] == 10 and figures["accept_length"] == 3.9
    modes = figures["breakdowns"]["field:mode"]
    assert [(g["group"], g["accept_length"], g["requests"]) for g in modes] == [
        ("sampled", 1.0, 5), ("greedy", 3.9, 5)]


def test_weak_rows_hold_each_id_once_its_lowest_answer() -> None:
    """`--n 4` (and `--turns all`) give an id several answers: weak.jsonl held p0257 x4 and
    so lost prompts when run again (`duplicate_id`). One row per id, its lowest answer."""
    scan = AcceptanceScan()
    slot = 0
    for i in range(30):
        for sample in range(4):  # the lowest ids' samples are all lower than other ids'
            scan.add(result(100, 10 + i + sample, id=f"p{i}", sample=sample), slot=slot)
            slot += 1
    rows = scan.lowest_rows()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == 20
    assert ids == [f"p{i}" for i in range(29, 9, -1)]
    assert all(r["sample"] == 3 for r in rows)  # each id's lowest answer: the most steps
    # An id seen again later with a lower answer replaces its kept one, still once.
    scan.add(result(100, 500, id="p15", sample=9), slot=slot)
    rows = scan.lowest_rows()
    assert rows[0]["id"] == "p15" and rows[0]["sample"] == 9
    assert [r["id"] for r in rows].count("p15") == 1 and len(rows) == 20


def two_drafters() -> AcceptanceScan:
    """The issue's run: a good drafter (gpu0) and a weak one (gpu1); on each, chat is the best
    category and math the worst, but the weak server got 50 % of chat's answers, 33 % of
    math's and 8 % of code's, so pooled, code ranks best and chat low."""
    scan = AcceptanceScan(group_by="category")
    effect = {"chat": 10, "code": 0, "math": -10}  # verify steps per 100 tokens, less is better
    shares = {"chat": 6, "code": 1, "math": 4}  # of 12 answers each, on the weak server
    slot = 0
    for category, weak in shares.items():
        for i in range(12):
            server = "gpu1" if i < weak else "gpu0"
            steps = (60 if server == "gpu1" else 28) - effect[category]
            scan.add(result(100, steps, id=f"{category}{i}", worker=server,
                            category=category), slot=slot)
            slot += 1
    return scan


def test_breakdowns_compare_within_each_server_and_say_so() -> None:
    figures = two_drafters().figures()
    assert figures is not None
    assert figures["compared"].startswith("within each server")
    cells = figures["breakdowns"]["field:category"]
    for server in ("gpu0", "gpu1"):
        mine = [g["group"] for g in cells if g["server"] == server]
        assert mine == ["math", "code", "chat"], cells  # lowest first, as each drafter saw it
    # The server breakdown itself is the comparison of the drafters, one line each.
    assert [g["group"] for g in figures["breakdowns"]["server"]] == ["gpu1", "gpu0"]
    assert all(g["by"] != "field:category" or g["group"] != "chat"
               for g in figures["lowest_groups"][:1])


def test_the_lowest_rows_are_the_lowest_within_their_server() -> None:
    """Pooled, the weak server's 11 answers would be the 11 lowest rows, whatever their
    prompts; ranked within each server, the lowest of each alternate, 10 of each."""
    rows = two_drafters().lowest_rows()
    assert len(rows) == 20
    assert [r["worker"] for r in rows[:6]] == ["gpu0", "gpu1"] * 3
    assert rows[0]["category"] == rows[1]["category"] == "math"
    assert sum(r["worker"] == "gpu1" for r in rows) == 10


def test_group_by_a_nested_field_a_typo_and_values_that_print_alike() -> None:
    """`--group-by categroy` or a nested `meta.src` gave (none) for every row with no word;
    `code` and `code ` were two groups that printed alike."""
    from fleetgen.cli.acceptance import acceptance_lines

    def scan_of(group_by: str) -> dict[str, Any]:
        scan = AcceptanceScan(group_by=group_by)
        for i in range(6):
            scan.add(result(100, 30 + i, id=f"q{i}", category="code" if i % 2 else "code ",
                            meta={"src": "web" if i < 3 else "book"}), slot=i)
        scan.add({"id": "plain", "completion_tokens": 9, "category": "code"}, slot=6)
        figures = scan.figures()
        assert figures is not None
        return figures

    nested = scan_of("meta.src")["breakdowns"]["field:meta.src"]
    assert sorted(g["group"] for g in nested) == ["book", "web"]
    spaced = scan_of("category")
    assert sorted(g["group"] for g in spaced["breakdowns"]["field:category"]) == [
        "'code '", "code"]
    assert "group_by_missing" not in spaced
    typo = scan_of("categroy")
    assert typo["group_by_missing"] == ["category", "meta"]
    lines = acceptance_lines(typo, None)
    assert any("warning: --group-by categroy: no answered row has that field" in line
               and "category, meta" in line for line in lines), lines
    # The answer of a server that does not speculate is named, not silently left out.
    assert typo["without_spec"] == 1
    assert any("1 more answers carried no acceptance" in line for line in lines), lines
