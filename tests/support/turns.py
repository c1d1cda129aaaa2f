"""`--turns all` runs: the input rows of conversations, every (id, turn) a run must write, and
every turn checked against the simulator's answer to the prompt built from the turns before."""

from __future__ import annotations

from typing import Any

from fleetgen.local.fleet import LocalFleet
from tests.support.content import expected, fleet_configs, tokenizer


def input_row(row_id: str, conv: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if conv["system"]:
        messages.append({"role": "system", "content": conv["system"]})
    for k, user in enumerate(conv["users"]):
        messages.append({"role": "user", "content": user})
        if k < len(conv["users"]) - 1 or conv["trailing_answer"]:
            messages.append({"role": "assistant", "content": f"ORIGINAL ANSWER {k + 1}"})
    if conv["sharegpt"]:
        speaker = {"system": "system", "user": "human", "assistant": "gpt"}
        return {"id": row_id, "conversations": [{"from": speaker[m["role"]], "value": m["content"]}
                                                for m in messages], "tag": row_id}
    return {"id": row_id, "messages": messages, "tag": row_id}


def prompt_of(conv: dict[str, Any], answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn len(answers)+1's prompt, as the issue defines it: u1, a1', ..., uk, ak', u(k+1),
    with ai' the answers written by this run (reasoning as `reasoning_content`)."""
    messages: list[dict[str, Any]] = []
    if conv["system"]:
        messages.append({"role": "system", "content": conv["system"]})
    for k, user in enumerate(conv["users"][:len(answers) + 1]):
        messages.append({"role": "user", "content": user})
        if k < len(answers):
            answer = {"role": "assistant", "content": answers[k]["completion"]}
            if isinstance(answers[k].get("reasoning"), str):
                answer["reasoning_content"] = answers[k]["reasoning"]
            messages.append(answer)
    return messages


def assert_turns_content(fleet: LocalFleet, convs: dict[str, dict[str, Any]],
                         results: list[dict[str, Any]], options: dict[str, Any]) -> int:
    """Every turn is the simulator's answer to the prompt built from the turns before it."""
    by_turn = {(r["id"], r["turn"]): r for r in results}
    config_for = fleet_configs(fleet)
    tok = tokenizer()
    bad = []
    for (row_id, turn), result in sorted(by_turn.items()):
        answers = [by_turn[(row_id, k)] for k in range(1, turn)]
        ids = tok.encode_batch([tok.render(prompt_of(convs[row_id], answers))])[0]
        want = expected(ids, result["max_tokens"], config_for(result["worker"]), {},
                        {"think": True, **options})
        got = {k: result.get(k) for k in want}
        if got != want:
            bad.append(f"{row_id} turn {turn}: "
                       f"{ {k: (got[k], want[k]) for k in want if got[k] != want[k]} }"[:300])
    assert not bad, "\n".join(bad[:5])
    return len(by_turn)


def expected_keys(convs: dict[str, dict[str, Any]],
                  bad: list[dict[str, Any]] | tuple[()] = ()) -> set[str]:
    """Every (id, turn) of the run; a bad row has one turn, rejected."""
    return {f"{i}@{k}" for i, c in convs.items() for k in range(1, len(c["users"]) + 1)} | \
        {f"{r['id']}@1" for r in bad}
