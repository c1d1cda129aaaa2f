"""The engine floor against real HTTP: a 200 that is an abort is an error, a duplicate rid is
retryable, and the readiness watch tells a slow server from a gone one."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from fleetgen import errors
from fleetgen.engine.health import Prober, State, Watch
from fleetgen.engine.openai import parse_completion
from fleetgen.engine.sglang import SGLangClient, from_response, parse_generation
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import run_in_thread
from tests.support.httpd import serving
from tests.support.sim import StartSim
from tests.support.waiting import wait_until

RUNNING_ABORT = {"text": "the model answers", "output_ids": [1, 2, 3], "meta_info": {
    "id": "r", "prompt_tokens": 4, "completion_tokens": 3, "cached_tokens": 0,
    "e2e_latency": 0.1, "finish_reason": {"type": "abort", "message": "Aborted",
                                          "status_code": None, "err_type": None}}}
WAITING_ABORT = {"text": "", "output_ids": [], "meta_info": {
    "id": "r", "completion_tokens": 0, "e2e_latency": 0.1, "weight_version": "default",
    "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}}}


@pytest.mark.parametrize(("body", "message"), [(RUNNING_ABORT, "Aborted"),
                                               (WAITING_ABORT, "Abort in waiting queue")])
def test_an_abort_finish_is_a_retryable_error_with_the_servers_message(
        body: dict[str, object], message: str) -> None:
    with pytest.raises(errors.AbortedError) as caught:
        parse_generation(body)
    assert isinstance(caught.value, errors.RetryableError)
    assert message in caught.value.message and caught.value.kind == "aborted"


def test_only_stop_and_length_are_answers() -> None:
    odd = json.loads(json.dumps(RUNNING_ABORT))
    odd["meta_info"]["finish_reason"] = {"type": "paused"}
    with pytest.raises(errors.RetryableError, match="paused"):
        parse_generation(odd)
    del odd["meta_info"]["finish_reason"]
    with pytest.raises(errors.RetryableError):
        parse_generation(odd)


def test_a_stop_string_finish_says_which_string() -> None:
    """FINISH_MATCHED_STR carries the string, FINISH_MATCHED_TOKEN the token's id
    (schedule_batch.py `to_json`); SGLang's /v1 passes it on as `matched_stop`, vLLM names the
    string `stop_reason`."""
    answer = json.loads(json.dumps(RUNNING_ABORT))
    answer["meta_info"]["finish_reason"] = {"type": "stop", "matched": " ok"}
    assert parse_generation(answer).stop_matched == " ok"
    answer["meta_info"]["finish_reason"] = {"type": "stop", "matched": 248046}
    assert parse_generation(answer).stop_matched is None
    usage = {"prompt_tokens": 1, "completion_tokens": 1}
    for choice, want in (({"matched_stop": " ok"}, " ok"), ({"stop_reason": " ok"}, " ok"),
                         ({"matched_stop": 248046}, None), ({"stop_reason": None}, None)):
        body = {"choices": [{"text": "a", "finish_reason": "stop", **choice}], "usage": usage}
        assert parse_completion(body).stop_matched == want


def test_an_abort_over_http_from_the_simulator_is_raised() -> None:
    # A request running on the simulator, aborted by rid from outside, as SGLang answers it.
    with run_in_thread(SimConfig(port=0, ttft_ms=10_000, health_delay_s=0)) as sim:
        client = SGLangClient(sim.url, timeout_s=30, concurrency=1)
        caught: list[BaseException] = []

        def call() -> None:
            try:
                client.generate([1, 2, 3], 8, {}, rid="victim-rid")
            except BaseException as exc:
                caught.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        with httpx.Client(base_url=sim.url) as http:
            wait_until(lambda: http.get("/_sim/stats").json()["in_flight"] == 1, 30,
                       "the request to be in flight")
            http.post("/abort_request", json={"rid": "victim-rid"})
        thread.join(30)
        client.close()
    assert len(caught) == 1 and isinstance(caught[0], errors.AbortedError), caught


def test_a_duplicate_rid_is_retryable_over_http() -> None:
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}, "rid": "same"}
    with run_in_thread(SimConfig(port=0, ttft_ms=10_000, health_delay_s=0)) as sim, \
            httpx.Client(base_url=sim.url, timeout=30) as http:
        first = threading.Thread(target=lambda: http.post("/generate", json=body))
        first.start()
        # Running, not merely in flight: `in_flight` counts a request from its first byte,
        # before its rid is registered (a loaded run sent the second one in that gap, and it
        # was served as a new request).
        wait_until(lambda: http.get("/_sim/stats").json()["num_running_reqs"] == 1, 30,
                   "the first request to be running")
        second = http.post("/generate", json=body)
        http.post("/abort_request", json={"abort_all": True})
        first.join(30)
    err = from_response(second)
    assert isinstance(err, errors.DuplicateRidError) and isinstance(err, errors.RetryableError)


@contextmanager
def _server(handle: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            handle(self)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


def test_a_server_that_answers_late_is_slow_not_gone() -> None:
    release = threading.Event()

    def late(request: BaseHTTPRequestHandler) -> None:
        release.wait(10)  # connected, no answer: a busy server
        request.send_response(200)
        request.end_headers()

    with _server(late) as url:
        watch = Watch(url, interval_s=0.05, gone_after_s=0.2, timeout_s=0.2)
        try:
            watch.start()  # the first probe is synchronous
            assert watch.last.state is State.SLOW
            assert watch.up() and not watch.gone()
            client = SGLangClient(url, timeout_s=5, concurrency=1)
            assert client.healthy()  # the task's check agrees: busy is not gone
            client.close()
        finally:
            release.set()
            watch.stop()


def test_a_refused_server_is_gone_only_after_the_threshold() -> None:
    with run_in_thread(SimConfig(port=0, health_delay_s=30)) as sim:
        watch = Watch(sim.url, interval_s=0.05, gone_after_s=1.0)
        watch.start()
        assert watch.last.state is State.READY  # /ready, not the 30 s /health
    try:
        wait_until(lambda: watch.last.state is State.REFUSED, 10, "a refused probe")
        assert not watch.gone()  # refused, but not yet for longer than the threshold
        wait_until(watch.gone, 10, "the server to count as gone")
        assert watch.down_for_s() > 1.0
    finally:
        watch.stop()


def test_a_server_never_seen_up_is_gone_at_once() -> None:
    def loading(request: BaseHTTPRequestHandler) -> None:
        request.send_response(503)
        request.end_headers()

    with _server(loading) as url:
        watch = Watch(url, interval_s=10, gone_after_s=60)
        watch.start()
        try:
            assert watch.last.state is State.NOT_READY and watch.gone()
        finally:
            watch.stop()


def test_every_sampling_option_the_producer_has_passes_sglangs_closed_schema(
        start_sim: StartSim) -> None:
    # api_types `decode_SamplingParams` refuses an unknown key with a 400: a misnamed option
    # would fail every production request. Every key of the contract's Sampling, with a value of
    # its type, must be accepted (a new option is covered by this test as soon as it exists).
    from fleetgen.engine.sglang import SGLangClient
    from fleetgen.queue.contract import Sampling

    values = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
              "repetition_penalty": 1.1, "seed": 7, "stop": ["\n\n"]}
    assert set(values) == set(Sampling.__annotations__)
    client = SGLangClient(start_sim().url, timeout_s=10, concurrency=1)
    try:
        gen = client.generate([1, 2, 3], 4, values, rid="schema:1:ab")
    finally:
        client.close()
    assert gen.finish_reason in ("stop", "length") and gen.prompt_tokens == 3


def test_a_server_that_answers_503_everywhere_while_it_loads_is_seen_ready_on_its_path(
        ) -> None:
    # llama-server: every path 503 "Loading model" while it loads, then `/ready` 404 and
    # `/health` 200. The 503 on `/ready` must not make the prober ask `/ready` alone for ever.
    loaded = threading.Event()

    class LoadingLlama(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 503 if not loaded.is_set() else 200 if self.path == "/health" else 404
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with serving(LoadingLlama) as url, httpx.Client(base_url=url) as http:
        prober = Prober(http, timeout_s=2.0)
        assert prober().state is State.NOT_READY
        loaded.set()
        found = prober()
        assert found.ready and found.detail == "/health 200"
        assert prober().ready
