"""The content check itself can fail: a swapped, cut or mis-counted row is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.content import assert_content, expected, input_ids, sim_config
from tests.support.pipeline import make_prompts


def test_content_check_catches_every_kind_of_wrong_row(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 3)
    config = sim_config(["--context-length", "4096", "--output-tokens-mean", "250",
                         "--seed", "3"])
    ids = input_ids(prompts, {"p0", "p1", "p2"})
    # A budget the thinking answers finish in, so each row has a completion of its own to swap.
    rows: list[dict[str, Any]] = [
        {"id": i, "line": n, "worker": "gpu0@h", "max_tokens": 2000,
         **expected(ids[i], 2000, config, {}, {"think": True})}
        for n, i in enumerate(("p0", "p1", "p2"), 1)]
    assert all(r["completion"] for r in rows) and len({r["completion"] for r in rows}) == 3
    assert assert_content(rows, prompts, config) == 3

    swapped = [dict(r) for r in rows]
    swapped[0]["completion"], swapped[1]["completion"] = rows[1]["completion"], \
        rows[0]["completion"]
    wrong_budget = [{**rows[2], "max_tokens": 7}]
    wrong_count = [{**rows[0], "prompt_tokens": rows[0]["prompt_tokens"] + 1}]
    null_id = [{**rows[0], "id": None}]
    for bad in (swapped, wrong_budget, wrong_count, null_id):
        with pytest.raises(AssertionError, match="differ from the simulator"):
            assert_content(bad, prompts, config)
    other_seed = sim_config(["--context-length", "4096", "--output-tokens-mean", "250"])
    with pytest.raises(AssertionError):
        assert_content(rows, prompts, other_seed)
    with pytest.raises(AssertionError):
        assert_content(rows, prompts, config, sampling={"seed": 1})
