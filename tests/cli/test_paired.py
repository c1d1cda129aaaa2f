"""fleetgen/cli/paired.py: two drafters on the same prompts, B − A of their pooled acceptance
with its interval, where each prompt's own difficulty cancels out."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from fleetgen.cli.paired import paired, steps_by_request


def answers(rng: random.Random, difficulty: list[float], gain: float) -> list[dict[str, Any]]:
    """One drafter's answers: 200 tokens a prompt, its accept length the prompt's own plus
    `gain`, with a little noise."""
    out = []
    for i, level in enumerate(difficulty):
        length = max(1.05, level + gain + rng.gauss(0, 0.05))
        out.append({"id": f"p{i}", "completion_tokens": 200,
                    "spec": {"verify_ct": round(200 / length)}})
    return out


def test_the_difference_of_two_drafters_on_the_same_prompts_and_its_interval() -> None:
    rng = random.Random(11)
    difficulty = [rng.uniform(1.2, 3.8) for _ in range(60)]  # prompts differ far more
    a = steps_by_request(answers(rng, difficulty, 0.0))
    b = steps_by_request(answers(rng, difficulty, 0.2))
    got = paired(a, b)
    assert got is not None and got["requests"] == 60
    low, high = got["difference_ci95"]
    assert 0 < low < got["difference"] < high  # B is better, and the interval says so
    assert abs(got["difference"] - (got["b"] - got["a"])) < 1e-3
    assert high - low < 0.2  # the prompts' spread (2.6 wide) cancels out of the pairs


def test_only_requests_both_answered_are_compared() -> None:
    a = steps_by_request([{"id": "x", "completion_tokens": 10, "spec": {"verify_ct": 5}},
                          {"id": "y", "completion_tokens": 10, "spec": {"verify_ct": 4}},
                          {"id": "z", "completion_tokens": 10, "spec": {"verify_ct": 2}}])
    b = steps_by_request([{"id": "x", "completion_tokens": 10, "spec": {"verify_ct": 4}},
                          {"id": "y", "completion_tokens": 10, "spec": {"verify_ct": 2}},
                          {"id": "w", "sample": 1, "completion_tokens": 9,
                           "spec": {"verify_ct": 3}}])
    got = paired(a, b)
    assert got is not None
    assert (got["requests"], got["only_a"], got["only_b"]) == (2, 1, 1)
    assert got["a"] == round(20 / 9, 4) and got["b"] == round(20 / 6, 4)
    assert paired(a, {}) is None


def test_report_paired_prints_the_ab_line(tmp_path: Path) -> None:
    from fleetgen.cli.report import paired_line

    for name, steps in (("a", 50), ("b", 40)):
        out = tmp_path / name
        out.mkdir()
        (out / ".fleetgen-run").write_text(f"{name}\n")
        rows = [{"id": f"p{i}", "completion_tokens": 100 + i, "line": i,
                 "spec": {"verify_ct": steps + i % 3}} for i in range(10)]
        (out / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    line = paired_line(tmp_path / "a", tmp_path / "b")
    assert "on the 10 requests both answered" in line and "difference +" in line, line
