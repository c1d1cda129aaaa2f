"""`--turns all` end to end through the real CLI: every assistant turn of every conversation
regenerated in order on this run's own earlier answers, exactly once, each turn the
simulator's answer to the prompt recomputed here from the turns written before it; budgets per
turn, a conversation that outgrows the context ended with a reason, bad conversations rejected,
and the exports of a multi-turn run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from fleetgen.local.fleet import LocalFleet
from tests.support.cli import fleetgen
from tests.support.content import tokenizer
from tests.support.pipeline import assert_exactly_once, write_jsonl
from tests.support.turns import assert_turns_content, expected_keys, input_row, prompt_of

LONG = "lorem ipsum dolor " * 3000  # about 9,000 tokens: more than the 8,192 context


def conversations() -> dict[str, dict[str, Any]]:
    """id -> (system, user turns, input shape): 1 to 4 user turns, the input's own answers
    between them (to be discarded), one ending on the dataset's answer."""
    convs: dict[str, dict[str, Any]] = {}
    for i in range(12):
        turns = [f"Question {j + 1} of conversation {i}: tell me about {i * 7 + j}."
                 for j in range(1 + i % 4)]
        convs[f"c{i}"] = {"system": "You are terse." if i % 3 == 0 else None, "users": turns,
                          "sharegpt": i % 5 == 4, "trailing_answer": i % 4 == 2}
    convs["long"] = {"system": None, "users": ["Short first question.", LONG, "Never asked."],
                     "sharegpt": False, "trailing_answer": False}
    return convs


BAD = [
    {"id": "no-user", "messages": [{"role": "system", "content": "Only a system turn."}]},
    {"id": "empty-turn", "messages": [{"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Hello"},
                                      {"role": "user", "content": "   "}]},
    {"id": "bad-role", "messages": [{"role": "wizard", "content": "Abracadabra"}]},
]


def run_turns(fleet: LocalFleet, prompts: Path, run: str, out: Path,
              *extra: str) -> subprocess.CompletedProcess[str]:
    """`fleetgen drain` and `fleetgen produce --turns all` side by side, as in production."""
    drain = subprocess.Popen([sys.executable, "-m", "fleetgen", "drain", "--run", run, "--out",
                              str(out), "--redis", fleet.redis_url], env=dict(os.environ),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        produced = fleetgen("produce", str(prompts), "--run", run, "--context-length", "8192",
                            "--turns", "all", "--out", str(out), "--redis", fleet.redis_url,
                            "--reconcile-interval", "2", *extra)
        stdout, stderr = drain.communicate(timeout=120)
        assert drain.returncode == 0, f"fleetgen drain: {stdout}{stderr}"
    finally:
        if drain.poll() is None:
            drain.kill()
    return produced


def test_every_turn_regenerated_in_order_exactly_once(fleet2: LocalFleet,
                                                      tmp_path: Path) -> None:
    convs = conversations()
    prompts = write_jsonl(tmp_path / "p.jsonl", [input_row(i, c) for i, c in convs.items()]
                          + BAD)
    out = tmp_path / "out"
    run_turns(fleet2, prompts, "turns", out, "--token-ids", "--max-output-tokens", "200")
    data = assert_exactly_once(out, expected_keys(convs, BAD))
    results = data["results"]
    # Every turn of every good conversation, the long one's first turn only.
    assert len(results) == sum(len(c["users"]) for c in convs.values()) - 2
    assert all(r["turns"] == len(convs[r["id"]]["users"]) for r in results)
    assert all(r["tag"] == r["id"] for r in results), "the row's own fields carried through"
    assert assert_turns_content(fleet2, convs, results, {"token_ids": True}) == len(results)
    # Budgets per turn: each turn's max_tokens is its own prompt's, not the first turn's.
    c3 = sorted((r for r in results if r["id"] == "c3"), key=lambda r: r["turn"])
    assert [r["prompt_tokens"] for r in c3] == sorted({r["prompt_tokens"] for r in c3})
    rejected = {(r["id"], r.get("turn")): r["reason"] for r in data["rejected"]}
    assert rejected[("long", 2)].startswith("context_full_at_turn: turn 2's prompt")
    assert rejected[("long", 3)].startswith("conversation_ended: turn 2 was rejected")
    assert rejected[("no-user", 1)].startswith("no_user_turn")
    assert rejected[("empty-turn", 1)].startswith("empty_prompt")  # one rule (issue 32)
    assert "unknown role 'wizard'" in rejected[("bad-role", 1)]
    summary = orjson.loads((out / "summary.json").read_bytes())
    total = sum(len(c["users"]) for c in convs.values()) + len(BAD)
    assert (summary["total"], summary["done"], summary["complete"]) == \
        (total, len(results), True)
    assert summary["settings"]["turns"] == "all"

    # The same commands again: nothing to do, nothing written twice.
    again = fleetgen("produce", str(prompts), "--run", "turns", "--context-length", "8192",
                     "--turns", "all", "--out", str(out), "--redis", fleet2.redis_url,
                     "--token-ids", "--max-output-tokens", "200")
    assert "already complete" in again.stdout
    assert_exactly_once(out, expected_keys(convs, BAD))

    # conversations: one line per regenerated turn, its history this run's earlier answers as
    # they were sent, the input's own answers gone.
    fleetgen("export", str(out), "--format", "conversations", "--include-unfinished")
    rows = {(r["id"], r["turn"]): r for r in map(
        orjson.loads, (out / "export.conversations.jsonl").read_bytes().splitlines())}
    assert set(rows) == {(r["id"], r["turn"]) for r in results}, "one line per turn written"
    for (row_id, turn), row in rows.items():
        answers = sorted((r for r in results if r["id"] == row_id and r["turn"] <= turn),
                         key=lambda r: r["turn"])
        last = {"role": "assistant", "content": answers[-1]["completion"],
                "reasoning_content": answers[-1]["reasoning"]}
        want = [*prompt_of(convs[row_id], answers[:-1]), last]
        assert row["conversations"] == want, row_id
        assert row["status"] == ("success" if answers[-1]["finish_reason"] == "stop"
                                 else "unfinished")
        assert "ORIGINAL ANSWER" not in orjson.dumps(row).decode()

    # tokens: one line per turn, its prompt the history as sent.
    fleetgen("export", str(out), "--format", "tokens", "--include-unfinished")
    lines = list(map(orjson.loads, (out / "export.tokens.jsonl").read_bytes().splitlines()))
    assert len(lines) == len(results)
    tok = tokenizer()
    for line, result in zip(lines, sorted(results, key=lambda r: (r["line"], r["turn"])),
                            strict=True):
        answers = [r for r in results if r["id"] == result["id"] and r["turn"] < result["turn"]]
        answers.sort(key=lambda r: r["turn"])
        prompt = tok.encode_batch([tok.render(prompt_of(convs[result["id"]], answers))])[0]
        assert (line["id"], line["turn"]) == (result["id"], result["turn"])
        assert line["input_ids"] == prompt + result["output_ids"]
        assert line["loss_mask"] == [0] * len(prompt) + [1] * len(result["output_ids"])

    refused = subprocess.run([sys.executable, "-m", "fleetgen", "export", str(out), "--format",
                              "openai-batch"], capture_output=True, text=True,
                             env=dict(os.environ))
    assert refused.returncode == 3 and "--turns all" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_turns_last_is_unchanged(fleet2: LocalFleet, tmp_path: Path) -> None:
    """The default regenerates the last turn only, on the dataset's own history, as before."""
    convs = {k: v for k, v in conversations().items() if k in ("c1", "c2", "c3")}
    prompts = write_jsonl(tmp_path / "p.jsonl", [input_row(i, c) for i, c in convs.items()])
    out = tmp_path / "out"
    fleetgen("produce", str(prompts), "--run", "turns-last", "--context-length", "8192",
             "--max-output-tokens", "100", "--redis", fleet2.redis_url)
    fleetgen("drain", "--run", "turns-last", "--out", str(out), "--redis", fleet2.redis_url)
    data = assert_exactly_once(out, set(convs))
    assert not any("turn" in r or "turns" in r for r in data["results"])


def test_turns_all_refuses_no_wait(fleet2: LocalFleet, tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [input_row("c1", conversations()["c1"])])
    for extra, words in ((["--no-wait", "--out", str(tmp_path / "o")], "--no-wait"),
                         ([], "--out DIR")):
        done = subprocess.run([sys.executable, "-m", "fleetgen", "produce", str(prompts),
                               "--run", "nowait", "--context-length", "8192", "--turns", "all",
                               "--redis", fleet2.redis_url, *extra],
                              capture_output=True, text=True, env=dict(os.environ))
        assert done.returncode == 3 and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def long_conversations(count: int) -> dict[str, dict[str, Any]]:
    """Four user turns each, long enough that a history is mostly prompt to cache."""
    filler = " ".join(f"word{k}" for k in range(120))
    return {f"h{i}": {"system": "You answer at length.", "users": [
        f"Turn {j + 1} of {i}: {filler} {i} {j}" for j in range(4)], "sharegpt": False,
        "trailing_answer": False} for i in range(count)}


def cached_share(results: list[dict[str, Any]]) -> tuple[float, float]:
    """Of every later turn: the share of the turn before's prompt its server had cached, and
    the share of later turns served by the worker that answered the turn before."""
    by_turn = {(r["id"], r["turn"]): r for r in results}
    later = [(by_turn[(r["id"], r["turn"] - 1)], r) for r in results if r["turn"] > 1]
    cached = sum(min(r["cached_tokens"], before["prompt_tokens"]) for before, r in later)
    history = sum(before["prompt_tokens"] for before, _ in later)
    same = sum(before["worker"] == r["worker"] for before, r in later)
    return cached / history, same / len(later)


def test_a_next_turn_goes_where_its_history_is_cached(fleet4: LocalFleet,
                                                      tmp_path: Path) -> None:
    """Prefix affinity (producer/affinity.py): on four servers, each later turn is sent to the
    worker that answered the turn before, whose server's prefix cache holds the history; with
    --no-affinity the shared queue scatters them (about 1 in 4 lands there by chance)."""
    convs = long_conversations(40)
    prompts = write_jsonl(tmp_path / "p.jsonl", [input_row(i, c) for i, c in convs.items()])
    figures = {}
    for name, extra in (("on", ()), ("off", ("--no-affinity",))):
        out = tmp_path / name
        run_turns(fleet4, prompts, f"affinity-{name}", out, "--max-output-tokens", "120", *extra)
        data = assert_exactly_once(out, expected_keys(convs, []))
        assert len(data["results"]) == 160
        figures[name] = cached_share(data["results"])
    (on_cached, on_same), (off_cached, off_same) = figures["on"], figures["off"]
    print(f"\nprefix affinity on 4 servers, 120 later turns: history cached {on_cached:.2f} "
          f"(same worker {on_same:.2f}); --no-affinity {off_cached:.2f} ({off_same:.2f})")
    assert on_same >= 0.9 and on_cached >= 0.9, figures
    assert off_same <= 0.6 and off_cached <= on_cached - 0.3, figures
