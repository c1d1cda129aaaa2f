"""The reasoning split, the JSON check and the compact logprobs: pure functions, and the result
record that carries them."""

from __future__ import annotations

import json

import pytest

from fleetgen.queue.contract import TaskPayload
from fleetgen.records.logprobs import compact
from fleetgen.records.outcomes import Generation, quality_counts, result_record
from fleetgen.records.reasoning import THINK_END_ID, THINK_START_ID, Split, split_reasoning
from fleetgen.records.structured import json_error

A, B, C = 11, 12, 13  # ordinary token ids
NL, PARA = 198, 271


@pytest.mark.parametrize(("text", "ids", "think_open", "want"), [
    # the model opened and closed its block: ids count up to and including </think>
    ("<think>\nhmm ok\n</think>\n\nYes.", [THINK_START_ID, NL, A, B, NL, THINK_END_ID, PARA, C],
     False, Split("hmm ok", "Yes.", 6, False)),
    # the budget ended inside the reasoning: no answer, every token is reasoning
    ("<think>\nhmm", [THINK_START_ID, NL, A], False, Split("hmm", "", 3, True)),
    # the prompt opened the block: no <think> in the answer, still reasoning first
    ("hmm\n</think>\n\nYes.", [A, NL, THINK_END_ID, PARA, C], True,
     Split("hmm", "Yes.", 3, False)),
    ("hmm, still", [A, B], True, Split("hmm, still", "", 2, True)),
    # no thinking at all (the prompt switched it off): all completion, nothing counted
    ("Yes.", [C], False, Split(None, "Yes.", 0, False)),
    # no ids (llama.cpp without logprobs): the split holds, the count is unknown
    ("<think>\nhmm\n</think>\n\nYes.", None, False, Split("hmm", "Yes.", None, False)),
    ("<think>\nhmm", None, False, Split("hmm", "", None, True)),
    ("Yes.", None, False, Split(None, "Yes.", None, False)),
    # the ids say <think> although the engine dropped it from the text
    ("\nhmm", [THINK_START_ID, NL, A], False, Split("hmm", "", 3, True)),
    # ids with </think>, text without: it cannot be cut, the whole text is the completion
    ("\nhmm\n\n\nYes.", [THINK_START_ID, NL, A, NL, THINK_END_ID, PARA, C], False,
     Split(None, "\nhmm\n\n\nYes.", 5, False)),
    # an empty answer after the block
    ("<think>\nhmm\n</think>\n\n", [THINK_START_ID, NL, A, NL, THINK_END_ID, PARA], False,
     Split("hmm", "", 5, False)),
])
def test_split(text: str, ids: list[int] | None, think_open: bool, want: Split) -> None:
    assert split_reasoning(text, ids, think_open=think_open) == want


SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                     "required": ["n"]})


def test_json_error_says_why() -> None:
    assert json_error('{"n": 3}', SCHEMA) is None
    assert json_error('{"n": "3"}', SCHEMA) == "at /n: '3' is not of type 'integer'"
    assert json_error('{"m": 3}', SCHEMA) == "at /: 'n' is a required property"
    assert (json_error('{"n": 3', SCHEMA) or "").startswith("not JSON: ")
    assert (json_error("", SCHEMA) or "").startswith("not JSON: ")
    assert (json_error("{}", '{"type": 7}') or "").startswith(
        "the schema is not a valid JSON Schema")


def test_compact_logprobs_round_and_keep_ids() -> None:
    record = compact([5, 6], [-0.123456, -0.00001], [[(5, -0.123456), (9, -2.5)],
                                                      [(6, -0.00001), (8, float("-inf"))]])
    assert record == {"ids": [5, 6], "lp": [-0.123, 0.0], "top_ids": [[5, 9], [6, 8]],
                      "top_lp": [[-0.123, -2.5], [0.0, None]]}
    assert "-0.0" not in json.dumps(record)
    assert compact([5], [-1.0]) == {"ids": [5], "lp": [-1.0]}


def payload(**options: object) -> TaskPayload:
    base = TaskPayload(run="r", line=3, id="x", input_ids=[1], max_tokens=50, sampling={},
                       row={"topic": "t"})
    base.update(options)  # type: ignore[typeddict-item]
    return base


def generation(text: str, ids: list[int] | None = None, **more: object) -> Generation:
    return Generation(text=text, finish_reason="stop", prompt_tokens=1,
                      completion_tokens=len(ids or []), cached_tokens=0, latency_s=0.1,
                      output_ids=ids, **more)  # type: ignore[arg-type]


def test_result_record_fields_and_counts() -> None:
    think = "<think>\nhmm\n</think>\n\n{\"n\": 1}"
    ids = [THINK_START_ID, NL, A, NL, THINK_END_ID, PARA, C]
    record = result_record(payload(think=True, json_schema=SCHEMA), generation(think, ids),
                           max_tokens=50, attempts=1, worker="w")
    assert (record["completion"], record["reasoning"], record["reasoning_tokens"]) == (
        '{"n": 1}', "hmm", 5)
    assert record["reasoning_unfinished"] is False and record["json_valid"] is True
    assert "json_error" not in record and "logprobs" not in record
    assert quality_counts(record) == {"empty": 0, "reasoning_unfinished": 0, "json_invalid": 0}

    cut = result_record(payload(think=True, json_schema=SCHEMA),
                        generation("<think>\nhmm", ids[:3]), max_tokens=50, attempts=1,
                        worker="w")
    assert cut["completion"] == "" and cut["reasoning_unfinished"] is True
    assert cut["json_valid"] is False and cut["json_error"].startswith("not JSON")
    assert quality_counts(cut) == {"empty": 1, "reasoning_unfinished": 1, "json_invalid": 1}

    plain = result_record(payload(), generation("  ", [A], logprobs={"ids": [A], "lp": [-1.0]}),
                          max_tokens=50, attempts=1, worker="w")
    assert "reasoning" not in plain and "json_valid" not in plain
    assert plain["logprobs"] == {"ids": [A], "lp": [-1.0]} and plain["completion"] == "  "
    assert quality_counts(plain) == {"empty": 1, "reasoning_unfinished": 0, "json_invalid": 0}


def test_a_stop_string_hit_inside_the_reasoning_leaves_it_unfinished() -> None:
    """SGLang cuts the text before the stop string and keeps the ids through it
    (`trim_matched_stop`): a stop `</think>` leaves the tag in the ids only. The text alone is
    split then: reasoning, no answer, unfinished (not all completion, as for an engine that
    dropped the tag from the text)."""
    ids = [A, B, NL, THINK_END_ID]
    assert split_reasoning("hmm ok\n", ids, think_open=True, stopped=True) == \
        Split("hmm ok", "", 4, True)
    assert split_reasoning("hmm ok\n", ids, think_open=True) == Split(None, "hmm ok\n", 4, False)
    payload = TaskPayload(run="r", line=1, id="s", input_ids=[1], max_tokens=9, sampling={},
                          row={}, think=True, think_open=True)
    gen = Generation("hmm ok\n", "stop", 1, 4, 0, 0.1, ids, stop_matched="</think>")
    record = result_record(payload, gen, max_tokens=9, attempts=1, worker="w")
    assert (record["finish_reason"], record["reasoning_unfinished"], record["completion"]) == \
        ("stop", True, "")
    assert quality_counts(record)["reasoning_unfinished"] == 1
