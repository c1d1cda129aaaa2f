"""Test helper: task payloads of a made-up run, for tests that enqueue without a producer."""

from __future__ import annotations

from fleetgen.queue.contract import TaskPayload


def payloads(run: str, n: int, *, max_tokens: int = 4) -> list[TaskPayload]:
    """`n` prompts of three tokens each, lines 1..n, ids run1..runN."""
    return [TaskPayload(run=run, line=i, id=f"{run}{i}", input_ids=[1, 2, i + 3],
                        max_tokens=max_tokens, sampling={}, row={}) for i in range(1, n + 1)]
