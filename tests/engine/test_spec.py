"""The SGLang client reads a finished answer's speculative fields into one `spec` object, by
0.5.23's names or earlier releases', and never fails an answer for their absence; the OpenAI
client reads vLLM's per-request `metrics.speculative_decoding` the same way, and the /metrics
counters only when the server gives no such object."""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest

from fleetgen.engine.api import ServerLimits
from fleetgen.engine.openai import OpenAIClient
from fleetgen.engine.sglang import SGLangClient, parse_generation, parse_spec
from fleetgen.engine.speculation import CounterDeltas, answers_per_request, parse_vllm_spec
from fleetgen.queue.contract import TaskPayload
from fleetgen.records.outcomes import result_record, split_result
from tests.support.sim import ENDLESS, StartSim, stats


def answer(**meta: Any) -> dict[str, Any]:
    return {"text": "a b", "output_ids": [1, 2], "meta_info": {
        "id": "r", "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 3,
        "completion_tokens": 40, **meta}}


def test_a_speculating_server_gives_every_answer_its_spec(start_sim: StartSim) -> None:
    sim = start_sim(speculative_algorithm="EAGLE3", output_tokens_mean=ENDLESS)
    client = SGLangClient(sim.url, timeout_s=10, concurrency=1)
    try:
        gen = client.generate([5, 6, 7, 8], 120, {}, "rid-1")
    finally:
        client.close()
    spec = gen.spec
    assert spec is not None
    assert spec["accept_length"] == gen.completion_tokens / spec["verify_ct"]
    assert spec["proposed_drafts"] == 3 * spec["verify_ct"]
    assert spec["accept_rate"] == spec["correct_drafts"] / spec["proposed_drafts"]
    assert sum(spec["histogram"]) == spec["verify_ct"]


def test_a_plain_server_gives_none(start_sim: StartSim) -> None:
    client = SGLangClient(start_sim(output_tokens_mean=ENDLESS).url, timeout_s=10,
                          concurrency=1)
    try:
        assert client.generate([5, 6, 7], 20, {}, "rid-2").spec is None
    finally:
        client.close()


def test_earlier_names_are_read_and_the_length_computed_where_missing() -> None:
    spec = parse_spec(answer(spec_verify_ct=16, spec_accepted_drafts=20,
                             spec_proposed_drafts=48, spec_accept_histogram=[4, 4, 4, 4])
                      ["meta_info"])
    assert spec == {"verify_ct": 16, "accept_length": 40 / 16, "correct_drafts": 20,
                    "proposed_drafts": 48, "histogram": [4, 4, 4, 4]}


@pytest.mark.parametrize("meta", [
    {}, {"spec_verify_ct": 0}, {"spec_verify_ct": None}, {"spec_verify_ct": "12"},
    {"spec_verify_ct": True},
])
def test_no_or_unusable_verify_count_is_no_spec_and_no_failure(meta: dict[str, Any]) -> None:
    gen = parse_generation(answer(**meta))
    assert gen.spec is None and gen.completion_tokens == 40


def test_odd_values_are_left_out_not_fatal() -> None:
    gen = parse_generation(answer(spec_verify_ct=10, spec_accept_length="fast",
                                  spec_num_correct_drafts=None,
                                  spec_correct_drafts_histogram=[1, "x"]))
    assert gen.spec == {"verify_ct": 10, "accept_length": 4.0}


def test_the_result_carries_spec_as_fleetgens_field() -> None:
    gen = parse_generation(answer(spec_verify_ct=10, spec_num_correct_drafts=25))
    payload: Any = {"id": "r1", "row": {"spec": "the row's own", "source": "a"}, "line": 0,
                    "input_ids": [1, 2, 3]}
    record = result_record(cast(TaskPayload, payload), gen, max_tokens=50, attempts=1,
                           worker="w")
    assert record["spec"] == {"verify_ct": 10, "accept_length": 4.0, "correct_drafts": 25}
    assert split_result(record).row == {"spec": "the row's own", "source": "a"}


def test_counter_deltas_baseline_throttle_and_restart() -> None:
    from fleetgen.engine.speculation import CounterDeltas, VllmCounters

    now = [0.0]
    pages = iter([VllmCounters(100, 300, 50), VllmCounters(110, 330, 60),
                  VllmCounters(4, 12, 2), VllmCounters(10, 30, 8)])
    reads: list[int] = []

    def read() -> VllmCounters | None:
        reads.append(1)
        return next(pages)

    deltas = CounterDeltas(read, clock=lambda: now[0])
    assert deltas.snapshot() is None  # not primed: no reading yet
    deltas.prime()
    deltas.prime()  # once only
    assert len(reads) == 1 and deltas.snapshot() is None  # within a second of the baseline
    now[0] = 1.5
    first = deltas.snapshot()
    assert first is not None and (first["drafts"], first["draft_tokens"],
                                  first["accepted"]) == (10, 30, 10)
    now[0] = 2.0
    assert deltas.snapshot() == first and len(reads) == 2  # throttled
    now[0] = 3.0
    deltas.snapshot()  # counters went back: the server restarted, a new baseline
    now[0] = 4.5
    again = deltas.snapshot()
    assert again is not None and again["since"] >= first["since"]
    assert (again["drafts"], again["accepted"]) == (6, 6)


def test_the_last_answer_in_flight_reads_the_counters_afresh() -> None:
    """A run's last answer carries counters with all its work in them, not a reading up to
    EVERY_S old (the drainer pools the run's figure from the last reading)."""
    from fleetgen.engine.speculation import CounterDeltas, VllmCounters

    pages = iter([VllmCounters(100, 300, 50), VllmCounters(110, 330, 60),
                  VllmCounters(130, 390, 90)])
    deltas = CounterDeltas(lambda: next(pages), clock=lambda: 0.0)  # the clock never moves
    deltas.prime()
    deltas.prime()  # two in flight
    assert not deltas.finished() and deltas.snapshot(fresh=False) is None  # throttled
    assert deltas.finished()  # the last one in flight
    got = deltas.snapshot(fresh=True)
    assert got is not None and (got["drafts"], got["accepted"]) == (10, 10)
    deltas.prime()
    assert deltas.finished()
    got = deltas.snapshot(fresh=True)
    assert got is not None and (got["drafts"], got["accepted"]) == (30, 40)


def test_a_server_without_counters_is_never_read_again() -> None:
    from fleetgen.engine.speculation import CounterDeltas

    reads: list[int] = []

    def read() -> None:  # a server whose /metrics has no spec_decode counters
        reads.append(1)

    deltas = CounterDeltas(read, clock=lambda: 99.0)
    deltas.prime()
    deltas.prime()
    assert deltas.snapshot() is None and len(reads) == 1


def test_a_pool_thread_never_waits_behind_another_metrics_read() -> None:
    """While one thread reads /metrics (a slow page), another finishing its generation gets
    the latest reading at once instead of queueing on the lock."""
    import threading

    from fleetgen.engine.speculation import CounterDeltas, VllmCounters
    from tests.support.waiting import wait_until

    release, inside = threading.Event(), threading.Event()
    pages = iter([VllmCounters(0, 0, 0), VllmCounters(10, 30, 8)])

    def read() -> VllmCounters | None:
        page = next(pages)
        if page.drafts:  # the second reading: hold it
            inside.set()
            release.wait(10)
        return page

    now = [0.0]
    deltas = CounterDeltas(read, clock=lambda: now[0])
    deltas.prime()
    now[0] = 5.0
    slow = threading.Thread(target=deltas.snapshot)
    slow.start()
    try:
        wait_until(inside.is_set, what="the first thread inside its /metrics read")
        assert deltas.snapshot() is None  # no reading yet, and no wait for the slow one
    finally:
        release.set()
        slow.join(10)
    latest = deltas.snapshot()
    assert latest is not None and latest["drafts"] == 10


# vLLM 0.32's object, as the real server answered a 200-token greedy request (the issue's).
VLLM_METRICS = {"time_to_first_token_ms": None, "speculative_decoding": {
    "mean_acceptance_length": 1 + 149 / 51, "draft_acceptance_rate": 1.0,
    "acceptance_histogram": [0, 2, 0, 49], "num_spec_steps": 51,
    "num_accepted_draft_tokens": 149, "num_draft_tokens": 149, "num_spec_tokens": 3,
    "per_step_accepted": None, "per_step_drafted": None}}


def test_vllms_per_request_object_is_the_spec_its_steps_tokens_pooled() -> None:
    spec = parse_vllm_spec({"metrics": VLLM_METRICS})
    assert spec == {"verify_ct": 51, "tokens": 200, "accept_length": 1 + 149 / 51,
                    "correct_drafts": 149, "proposed_drafts": 149, "accept_rate": 1.0,
                    "histogram": [0, 2, 0, 49]}
    # No verify step (a sampled answer the n-gram never matched): one token a step, kept.
    none = {**VLLM_METRICS["speculative_decoding"], "num_spec_steps": 0,
            "num_accepted_draft_tokens": 0, "num_draft_tokens": 0,
            "acceptance_histogram": [0, 0, 0, 0]}
    assert parse_vllm_spec({"metrics": {"speculative_decoding": none}}) == {
        "verify_ct": 0, "tokens": 0, "accept_length": 1.0, "correct_drafts": 0,
        "histogram": [0, 0, 0, 0]}
    # No object (the flag off, n > 1), a bad count: no spec.
    for answer_ in ({"metrics": None}, {},
                    {"metrics": {"speculative_decoding": {"num_spec_steps": "51"}}}):
        assert parse_vllm_spec(answer_) is None


def vllm_client(url: str) -> OpenAIClient:
    return OpenAIClient(url, timeout_s=10, concurrency=1,
                        limits=ServerLimits(context_length=4096, engine="vllm"))


@pytest.mark.parametrize("per_request", [True, False])
def test_vllm_answers_carry_their_own_spec_else_the_counters(
        start_sim: StartSim, per_request: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CounterDeltas, "EVERY_S", 0.0)  # read the counters after every answer
    sim = start_sim(flavor="vllm", speculative_algorithm="NGRAM",
                    speculative_num_draft_tokens=4, output_tokens_mean=ENDLESS,
                    per_request_spec_decode_metrics="summary" if per_request else "none")
    client = vllm_client(sim.url)
    try:
        gens = [client.generate([5, 6, 7, i], 60, {}, f"rid-{i}") for i in range(3)]
    finally:
        client.close()
    if not per_request:  # the fallback: the counters' growth, no spec
        assert all(g.spec is None for g in gens) and gens[-1].spec_counters is not None
        return
    assert all(g.spec_counters is None for g in gens)
    specs = [g.spec for g in gens]
    assert all(s is not None and s["tokens"] == s["verify_ct"] + s["correct_drafts"]
               for s in specs)
    # The answers' own counts add up to the server's counters, as vLLM's do.
    with httpx.Client(base_url=sim.url) as http:
        counted = stats(http)["spec_decode"]
    assert counted["num_drafts"] == sum(s["verify_ct"] for s in specs if s)
    assert counted["num_accepted_tokens"] == sum(s["correct_drafts"] for s in specs if s)
    assert counted["num_draft_tokens"] == sum(s["proposed_drafts"] for s in specs if s)


@pytest.mark.parametrize("per_request", [True, False])
def test_the_probe_says_whether_answers_carry_their_acceptance(start_sim: StartSim,
                                                                per_request: bool) -> None:
    sim = start_sim(flavor="vllm", speculative_algorithm="NGRAM",
                    per_request_spec_decode_metrics="summary" if per_request else "none")
    assert answers_per_request(sim.url) is per_request
