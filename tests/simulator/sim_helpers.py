"""Helpers shared by the simulator tests: condition waits and small HTTP shortcuts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from fleetgen.simulator import SimThread

T = TypeVar("T")
StartSim = Callable[..., SimThread]  # the type of the `start_sim` fixture

# Requests that must hold a slot for a known time: the natural answer is far longer
# than max_new_tokens, so completion_tokens == max_new_tokens exactly.
ENDLESS = 10**6


def wait_until(
    probe: Callable[[], T], timeout_s: float = 5.0, what: str = "condition"
) -> T:
    """Poll `probe` until it returns something truthy; fail after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


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
