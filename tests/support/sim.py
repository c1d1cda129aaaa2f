"""Simulated servers in this process: the `start_sim` fixture's type and small HTTP shortcuts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from fleetgen.simulator import SimThread

StartSim = Callable[..., SimThread]  # the type of the `start_sim` fixture

# Requests that must hold a slot for a known time: the natural answer is far longer
# than max_new_tokens, so completion_tokens == max_new_tokens exactly.
ENDLESS = 10**6


def stats(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/_sim/stats")
    response.raise_for_status()
    return response.json()


def generate(
    client: httpx.Client, input_ids: list[int], max_new_tokens: int = 16, **extra: Any
) -> httpx.Response:
    body: dict[str, Any] = {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens},
    }
    body.update(extra)
    return client.post("/generate", json=body)
