"""The SGLang client reads a finished answer's speculative fields into one `spec` object, by
0.5.23's names or earlier releases', and never fails an answer for their absence."""

from __future__ import annotations

from typing import Any, cast

import pytest

from fleetgen.base.contract import TaskPayload
from fleetgen.base.outcomes import result_record, split_result
from fleetgen.engine.sglang import SGLangClient, parse_generation, parse_spec
from tests.support.sim import ENDLESS, StartSim


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
