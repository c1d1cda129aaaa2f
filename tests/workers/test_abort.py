"""Aborted requests come back from SGLang as HTTP 200 with `finish_reason.type == "abort"`
(partial text when running, no prompt_tokens when waiting): never a result. Abort every
request on half of a fleet's servers mid-run and every row must still be answered once,
in full."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetgen.local.fleet import LocalFleet
from tests.support.content import assert_fleet_content
from tests.support.fleet import sim_fleet
from tests.support.pipeline import assert_exactly_once, drain, make_prompts, produce
from tests.support.waiting import wait_until

# Starts real Celery worker processes: the fleet tier (tests/conftest.py).
pytestmark = pytest.mark.fleet

MEAN_TOKENS = 100
SEED = 0


@pytest.fixture()
def fleet(tmp_path: Path) -> Iterator[LocalFleet]:
    # 4 running slots and 5 worker threads per GPU: one request waits in each server's
    # queue, so both kinds of abort (running and waiting) happen.
    local = sim_fleet(tmp_path / "fleet", gpus=4, max_running_requests=4, concurrency=5,
                      ttft_ms=5, tpot_ms=20, output_tokens_mean=MEAN_TOKENS, seed=SEED,
                      worker_env={"FLEETGEN_BACKOFF_BASE_S": "0.1"})
    local.start()
    yield local
    local.stop()


def _stats(http: httpx.Client, url: str) -> dict[str, Any]:
    stats: dict[str, Any] = http.get(url + "/_sim/stats").json()
    return stats


def test_aborted_requests_are_retried_never_written(fleet: LocalFleet, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 60, seed=3)
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            produce(fleet, prompts, "abort", max_output_tokens=300)
        except BaseException as exc:
            errors.append(exc)

    threading.Thread(target=producer, daemon=True).start()
    victims = [fleet.engine_url(0), fleet.engine_url(1)]
    with httpx.Client(timeout=10) as http:
        # Prove they hold work: every slot of both servers busy.
        seen: list[list[tuple[int, int]]] = []

        def full() -> bool:
            stats = [_stats(http, u) for u in victims]
            seen.append([(s["num_running_reqs"], s["num_queue_reqs"]) for s in stats])
            return all(running == 4 for running, _ in seen[-1])

        try:
            wait_until(full, 60, "both servers to be full")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; (running, queued) last seen: {seen[-5:]}") from exc
        for url in victims:
            assert http.post(url + "/abort_request", json={"abort_all": True}).status_code == 200
        # At least the 4 running on each (counted as the aborted handlers finish).
        wait_until(lambda: all(_stats(http, u)["aborted_total"] >= 4 for u in victims), 10,
                   "the aborts to be answered")

    out = tmp_path / "out"
    summary = drain(fleet, "abort", out, errors, timeout_s=240)
    data = assert_exactly_once(out, set(kinds["good"]))
    assert summary["failed"] == 0 and not data["failures"], data["failures"][:3]
    assert b"abort" not in (out / "results.jsonl").read_bytes()
    # No partial answer: each result is what the model says in full for its budget (text,
    # token count, finish reason and prompt tokens, against the simulator's own model).
    assert assert_fleet_content(fleet, prompts, data) == len(kinds["good"])
    results = data["results"]
    assert any(r["attempts"] > 1 for r in results)  # the aborted ones were tried again
