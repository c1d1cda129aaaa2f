"""The budget against SGLang's rules: the tokenizer manager's and the scheduler's."""

from __future__ import annotations

import pytest

from producer.budget import Limits, budget

CTX = 8192


def sglang_accepts(prompt: int, max_new: int, ctx: int, max_total: int | None = None) -> bool:
    """SGLang's checks as documented in shared/notes, including the pre-2026 `>=` form and
    the silent clamp (a clamped request is not what we asked for, so it counts as a miss)."""
    max_req_len = ctx - 1 if max_total is None else min(ctx - 1, max_total - 1)
    if prompt >= ctx or prompt + max_new >= ctx:
        return False
    if prompt >= max_req_len - 5:
        return False
    return max_new <= max_req_len - prompt - 1


def test_no_cap_uses_all_the_room_and_nothing_more() -> None:
    b = budget(111, Limits(CTX))
    assert b.max_tokens == CTX - 111 - 2
    assert sglang_accepts(111, b.max_tokens, CTX)
    assert not sglang_accepts(111, b.max_tokens + 1, CTX)


def test_seed_scenario_cap_8192_never_exceeds_context() -> None:
    for prompt in (1, 50, 111, 4000, 8000, CTX - 7):
        b = budget(prompt, Limits(CTX, cap=8192, min_output_tokens=1))
        assert not b.rejected, prompt
        assert prompt + b.max_tokens < CTX
        assert sglang_accepts(prompt, b.max_tokens, CTX)


def test_cap_below_the_room_wins() -> None:
    assert budget(100, Limits(CTX, cap=512)).max_tokens == 512


def test_cap_above_the_room_is_cut_to_the_room() -> None:
    assert budget(8000, Limits(CTX, cap=4096, min_output_tokens=1)).max_tokens == CTX - 8000 - 2


def test_exactly_at_the_scheduler_limit_is_rejected_one_below_passes() -> None:
    limits = Limits(CTX, min_output_tokens=1)
    # max_req_input_len = (CTX - 1) - 5; an input equal to it is refused by SGLang.
    assert budget(CTX - 6, limits).rejected
    ok = budget(CTX - 7, limits)
    assert not ok.rejected and ok.max_tokens == 5
    assert sglang_accepts(CTX - 7, ok.max_tokens, CTX)


def test_prompt_longer_than_context_rejected_with_reason() -> None:
    b = budget(9000, Limits(CTX))
    assert b.rejected and b.reason is not None and b.reason.startswith("prompt_too_long")
    assert "9000" in b.reason


def test_minimum_output_rejects_prompts_that_leave_too_little() -> None:
    limits = Limits(CTX, min_output_tokens=64)
    assert not budget(CTX - 2 - 64, limits).rejected
    b = budget(CTX - 2 - 63, limits)
    assert b.rejected and b.reason is not None and b.reason.startswith("no_room_for_output")


def test_kv_capacity_below_context_tightens_both_rules() -> None:
    limits = Limits(CTX, max_total_tokens=4096, min_output_tokens=1)
    b = budget(1000, limits)
    assert b.max_tokens == 4095 - 1000 - 1
    assert sglang_accepts(1000, b.max_tokens, CTX, max_total=4096)
    assert budget(4096 - 6, limits).rejected


def test_margin_leaves_room_for_a_tokenizer_that_counts_more() -> None:
    assert budget(100, Limits(CTX, margin=10)).max_tokens == CTX - 100 - 2 - 10


@pytest.mark.parametrize("prompt", range(1, CTX + 50, 97))
def test_every_accepted_budget_is_accepted_by_sglang(prompt: int) -> None:
    b = budget(prompt, Limits(CTX, min_output_tokens=1))
    if not b.rejected:
        assert sglang_accepts(prompt, b.max_tokens, CTX)


def test_invalid_limits_name_the_field() -> None:
    with pytest.raises(ValueError, match="max_output_tokens"):
        Limits(CTX, cap=0)
    with pytest.raises(ValueError, match="context_length"):
        Limits(8)

