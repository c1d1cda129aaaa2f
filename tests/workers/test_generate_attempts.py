"""generate_one against a real HTTP server that aborts every request: each attempt gets a rid
of its own, and past the attempt limit the row is a failure carrying the server's abort
message, never a result. And the task's side of each decision against a scripted engine: what
it sends again, how long it waits, when it probes the server."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from fleetgen import errors
from fleetgen.engine.api import PLAIN, GenerateOptions
from fleetgen.engine.decision import RetryPolicy
from fleetgen.engine.openai import ContextRule
from fleetgen.engine.sglang import SGLangClient, generate_body
from fleetgen.errors import EngineGone
from fleetgen.queue.contract import TaskPayload
from fleetgen.records.outcomes import Generation
from tests.support.httpd import serving
from workers.generate import (
    PROBE_EVERY_S,
    Pacing,
    generate_one,
    generate_options,
    request_id,
)

ABORTED = {"text": "the model", "output_ids": [1, 2], "meta_info": {
    "id": "r", "prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0,
    "e2e_latency": 0.1, "finish_reason": {"type": "abort", "message": "Aborted",
                                          "status_code": None, "err_type": None}}}


class MemorySink:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    def is_done(self, run: str, line: int) -> bool:
        return False

    def emit(self, run: str, kind: str, line: int, record: dict[str, Any],
             stats: dict[str, int], payload: dict[str, Any] | None = None) -> bool:
        self.emitted.append((kind, record))
        return True


@pytest.fixture()
def aborting_server() -> Iterator[tuple[str, list[str]]]:
    rids: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /ready: up
            self.send_response(200)
            self.end_headers()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            rids.append(body["rid"])
            data = json.dumps(ABORTED).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url, rids


def test_aborted_on_every_attempt_is_a_failure_with_the_abort_message(
        aborting_server: tuple[str, list[str]]) -> None:
    url, rids = aborting_server
    client = SGLangClient(url, timeout_s=10, concurrency=1)
    sink = MemorySink()
    payload = TaskPayload(run="r", line=7, id="x7", input_ids=[1, 2, 3], max_tokens=8,
                          sampling={}, row={})
    kind = generate_one(payload, client, sink, RetryPolicy(max_attempts=3), worker="w",
                        pacing=Pacing(sleep=lambda _: None, rng=random.Random(0)))
    client.close()
    assert kind == "failure"
    [(emitted, record)] = sink.emitted
    assert emitted == "failure" and record["attempts"] == 3
    assert record["error"]["type"] == "aborted" and "Aborted" in record["error"]["message"]
    assert len(rids) == 3 and len(set(rids)) == 3  # a new rid for every attempt


def test_rids_are_unique_and_never_a_prefix_of_one_another() -> None:
    rids = [request_id("run", line) for line in (1, 1, 10, 11, 100) for _ in range(3)]
    assert len(set(rids)) == len(rids)
    assert not [(a, b) for a in rids for b in rids if a != b and b.startswith(a)]


@pytest.mark.parametrize(("extra", "waits"), [
    ({"think": True, "think_open": True, "json_schema": "{}"}, True),
    # enable_thinking false: the prompt closed the block, so no grammar may wait for </think>
    ({"think": True, "json_schema": "{}"}, False),
    ({"think": True, "think_open": True}, False),  # no schema, no grammar
    ({"json_schema": "{}"}, False),
])
def test_require_reasoning_only_when_the_prompt_left_the_think_block_open(
        extra: dict[str, Any], waits: bool) -> None:
    payload = TaskPayload(run="r", line=1, id="a", input_ids=[1], max_tokens=8, sampling={},
                          row={})
    payload.update(extra)  # type: ignore[typeddict-item]
    options = generate_options(payload)
    assert options.reasoning_first is waits
    assert ("require_reasoning" in generate_body([1], 8, {}, "r:1:ab", options)) is waits


class ScriptedEngine:
    """An engine that raises the scripted errors in turn, then answers; counts its probes."""

    rule = ContextRule("vllm")
    base_url = "http://scripted"

    def __init__(self, *raises: errors.EngineError, up: bool = True) -> None:
        self.raises = list(raises)
        self.up = up
        self.budgets: list[int] = []
        self.probes = 0

    def generate(self, input_ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
                 rid: str, options: GenerateOptions = PLAIN) -> Generation:
        self.budgets.append(max_new_tokens)
        if self.raises:
            raise self.raises.pop(0)
        return Generation(text="ok", finish_reason="stop", prompt_tokens=3,
                          completion_tokens=1, cached_tokens=0, latency_s=0.1)

    def healthy(self) -> bool:
        self.probes += 1
        return self.up

    def close(self) -> None:
        pass


def run_one(engine: ScriptedEngine, sleeps: list[float]) -> tuple[str, MemorySink]:
    sink = MemorySink()
    payload = TaskPayload(run="r", line=1, id="x1", input_ids=[1, 2, 3], max_tokens=200,
                          sampling={}, row={})
    policy = RetryPolicy(max_attempts=3, gone_s=1.0)
    kind = generate_one(payload, engine, sink, policy, worker="w",
                        pacing=Pacing(sleep=sleeps.append, rng=random.Random(0)))
    return kind, sink


def test_a_corrected_budget_is_sent_at_once_and_recorded() -> None:
    engine = ScriptedEngine(errors.ContextLengthError("too long", 400, 4000, 4096))
    sleeps: list[float] = []
    kind, sink = run_one(engine, sleeps)
    assert kind == "result" and engine.budgets == [200, 96]
    [(_, record)] = sink.emitted
    assert (record["attempts"], record["max_tokens"]) == (2, 96)
    assert sleeps == [] and engine.probes == 0  # no wait, no probe: the server answered


def test_a_retry_waits_its_backoff_after_the_server_answers_its_probe() -> None:
    engine = ScriptedEngine(errors.RetryableError("queue full", 503))
    sleeps: list[float] = []
    kind, _ = run_one(engine, sleeps)
    assert kind == "result" and engine.budgets == [200, 200] and engine.probes == 1
    [delay] = sleeps
    assert 0 <= delay <= RetryPolicy().base_s


def test_a_server_that_stays_down_gets_the_prompt_handed_back() -> None:
    engine = ScriptedEngine(errors.EngineUnreachable("cannot connect"), up=False)
    sleeps: list[float] = []
    with pytest.raises(EngineGone, match="cannot connect"):
        run_one(engine, sleeps)
    # Probed every PROBE_EVERY_S for gone_s (1 s), then handed back with no backoff.
    assert sleeps == [PROBE_EVERY_S] * 2 and engine.probes == 3


def test_a_refusal_is_written_without_a_probe_or_a_wait() -> None:
    engine = ScriptedEngine(errors.PermanentError("bad temperature", 400), up=False)
    sleeps: list[float] = []
    kind, sink = run_one(engine, sleeps)
    assert kind == "failure" and (sleeps, engine.probes) == ([], 0)
    [(_, record)] = sink.emitted
    assert record["error"]["type"] == "permanent" and record["attempts"] == 1
