"""`--turns all`'s pure core and its reading of the drainer's files: user turns, the history of
each next turn, and what the files say is settled (torn tails, rewritten failures)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from fleetgen.errors import ConfigError
from fleetgen.queue.contract import TaskPayload
from fleetgen.records.outcomes import Generation, result_record
from producer.turns import WrittenTurns, answer_message, row_object, turn_messages, user_turns

SYS = {"role": "system", "content": "Be brief."}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_user_turns_cut_at_the_answers_and_drop_them() -> None:
    turns = user_turns([SYS, user("a"), assistant("A"), user("b"), user("b2"),
                        assistant("B"), user("c")])
    assert turns == [[SYS, user("a")], [user("b"), user("b2")], [user("c")]]
    assert user_turns([user("only")]) == [[user("only")]]


@pytest.mark.parametrize(("messages", "code"), [
    ([SYS], "no_user_turn"),
    ([user("a"), assistant("A"), user("  ")], "empty_turn"),
    ([user("a"), assistant("A"), assistant("A2"), user("b")], "bad_turns"),
    ([assistant("hello"), user("a")], "bad_turns"),
    ([user("a"), assistant("A"), {"role": "user", "content": []}], "empty_turn"),
])
def test_bad_conversations_say_why(messages: list[dict[str, object]], code: str) -> None:
    with pytest.raises(ValueError, match=f"^{code}:"):
        user_turns(messages)  # type: ignore[arg-type]


def test_turn_messages_put_this_runs_answers_between_the_user_turns() -> None:
    turns = [[SYS, user("a")], [user("b")], [user("c")]]
    a1 = answer_message({"completion": "A'", "reasoning": "because"})
    a2 = answer_message({"completion": "B'", "reasoning": None})
    assert a1 == {"role": "assistant", "content": "A'", "reasoning_content": "because"}
    assert turn_messages(turns, []) == [SYS, user("a")]
    assert turn_messages(turns, [a1, a2]) == [SYS, user("a"), a1, user("b"), a2, user("c")]


def test_row_object_leaves_out_fleetgen_fields() -> None:
    record = {"id": "x", "messages": [user("a")], "tag": 1, "completion": "A", "turn": 1,
              "turns": 2, "line": 3, "worker": "gpu0@h"}
    assert row_object(record) == {"id": "x", "messages": [user("a")], "tag": 1}


def test_row_object_gives_back_the_rows_fields_named_like_fleetgens() -> None:
    """The next turn is rendered from the row as it was read: its own `completion` and `turn`
    too, not this run's answer or turn number."""
    row = {"messages": [user("a"), assistant("A"), user("b")], "completion": "ref", "turn": 9}
    record = result_record(
        TaskPayload(run="r", line=3, id="x", input_ids=[1], max_tokens=5, sampling={},
                    row=row, turn=1, turns=2),
        Generation("A'", "stop", 1, 1, 0, 0.1), max_tokens=5, attempts=1, worker="w")
    assert (record["completion"], record["turn"]) == ("A'", 1)
    assert row_object(orjson.loads(orjson.dumps(record))) == {"id": "x", **row}


def write(path: Path, records: list[dict[str, object]], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records) + tail)


def test_written_turns_follow_the_files(tmp_path: Path) -> None:
    (tmp_path / ".fleetgen-run").write_text("r\n")
    w = WrittenTurns(tmp_path, "r")
    w.check_owner()
    assert w.poll() == [] and w.settled() == 0  # nothing written yet
    # conversation of 3 turns at slots 1..3, one of 2 turns at 4..5, a torn line after them
    r1 = {"id": "a", "line": 1, "turn": 1, "turns": 3, "completion": "A1"}
    r4 = {"id": "b", "line": 2, "slot": 4, "turn": 1, "turns": 2, "completion": "B1"}
    write(tmp_path / "results.jsonl", [r1, r4], b'{"id": "a", "line": 1, "slot": 2, "tu')
    assert [r["id"] for r in w.poll()] == ["a", "b"]
    assert set(w.pending) == {2, 5} and w.settled() == 2 and not w.has(2)
    # the torn line completed by the drainer's next write: read once, whole
    r2 = {"id": "a", "line": 1, "slot": 2, "turn": 2, "turns": 3, "completion": "A2"}
    write(tmp_path / "results.jsonl", [r1, r4, r2])
    assert w.poll() == [r2]
    assert w.history(r2) == [r1, r2]
    # turn 2 of b failed: no later turn of b, but settled; then a retry turns it to a result
    failure = {"id": "b", "line": 2, "slot": 5, "turn": 2, "turns": 2, "error": {}}
    write(tmp_path / "failures.jsonl", [failure])
    w.poll()
    assert w.settled() == 4 and w.has(5)
    c3 = {"id": "c", "line": 3, "slot": 6, "turn": 1, "turns": 3}
    write(tmp_path / "failures.jsonl", [failure, c3])
    w.poll()
    assert w.settled() == 4 + 3, "a failed first turn holds its two later turns back"
    (tmp_path / "failures.jsonl").write_bytes(orjson.dumps(c3) + b"\n")  # compacted
    r5 = {"id": "b", "line": 2, "slot": 5, "turn": 2, "turns": 2, "completion": "B2"}
    write(tmp_path / "results.jsonl", [r1, r4, r2, r5])
    assert w.poll() == []  # b is finished
    assert w.settled() == 4 + 3
    w.close()


def test_written_turns_refuse_another_runs_directory(tmp_path: Path) -> None:
    (tmp_path / ".fleetgen-run").write_text("other\n")
    with pytest.raises(ConfigError, match="holds the output of run 'other'"):
        WrittenTurns(tmp_path, "mine").check_owner()
