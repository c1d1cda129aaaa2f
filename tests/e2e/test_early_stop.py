"""The early warning on a run with a deliberately wrong budget: `--max-output-tokens 16` against
answers of ~60 tokens truncates nearly every answer, so `--stop-if 'truncated>0.5' --after 40`
stops feeding the queue, lets what was queued finish, and exits 1 with the reason; the
drainer ends with what was sent; the same command refuses to go on, `--ignore-stop` goes on,
and the run then ends exactly once with every answer checked."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from fleetgen.local.fleet import LocalFleet
from fleetgen.queue.redisconn import connect
from fleetgen.runstate.keys import RunKeys
from producer.earlystop import judge, parse_rule
from tests.support.cli import cli
from tests.support.content import assert_fleet_content
from tests.support.pipeline import assert_exactly_once, read_output, write_jsonl

ROWS = 400


def test_a_wrong_budget_stops_the_run_early(fleet2: LocalFleet, tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [
        {"id": f"r{i}", "messages": [{"role": "user", "content": f"Explain {i} at length."}]}
        for i in range(ROWS)])
    out, redis = tmp_path / "out", fleet2.redis_url
    produce = ("produce", str(prompts), "--run", "early", "--context-length", "8192",
               "--max-output-tokens", "16", "--stop-if", "truncated>0.5", "--after", "40",
               "--high-water", "16", "--batch-size", "8", "--redis", redis)
    first = cli(*produce)
    assert first.returncode == 1, first.stderr
    assert "stopped early: truncated" in first.stderr and "--ignore-stop" in first.stderr
    client = connect(redis)
    keys = RunKeys("early")
    sent = client.bitcount(keys.sent)
    assert 40 <= sent < ROWS, f"{sent} requests sent: the stop did not spare the rest"
    assert client.bitcount(keys.done) == sent, "what was queued must finish before the exit"
    status = orjson.loads(cli("status", "--run", "early", "--json", "--redis", redis).stdout)
    assert status["state"] == "stopped" and "truncated" in status["stop_reason"]
    assert status["shares"]["truncated"] > 0.5
    print(f"\nstopped after {sent} of {ROWS} rows: {status['stop_reason']}")

    drained = cli("drain", "--run", "early", "--out", str(out), "--redis", redis)
    assert drained.returncode == 1 and "stopped early" in drained.stderr
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["complete"] is False and "truncated" in summary["stopped"]
    assert summary["done"] == sent and summary["truncated"] > sent / 2
    assert len(read_output(out)["results"]) == sent

    again = cli(*produce)
    assert again.returncode == 1 and "stopped early" in again.stderr
    assert client.bitcount(keys.sent) == sent, "a stopped run is not fed without --ignore-stop"

    going_on = cli(*produce, "--ignore-stop")
    assert going_on.returncode == 0, going_on.stderr
    assert cli("drain", "--run", "early", "--out", str(out), "--redis", redis).returncode == 0
    data = assert_exactly_once(out, {f"r{i}" for i in range(ROWS)})
    assert assert_fleet_content(fleet2, prompts, data) == ROWS


@pytest.mark.parametrize(("rule", "stats", "stops"), [
    ("truncated>0.2", {"done": "100", "truncated": "21"}, True),
    ("truncated>0.2", {"done": "100", "truncated": "20"}, False),
    ("truncated>=20%", {"done": "100", "truncated": "20"}, True),
    ("empty>0.1", {"done": "90", "failed": "10", "empty": "11"}, True),
    ("unfinished>0", {"done": "50", "reasoning_unfinished": "1"}, True),
    ("failed>0.5", {"done": "10", "failed": "40"}, True),
    ("truncated>0.2", {"done": "49", "truncated": "49"}, False),  # fewer than --after 50
])
def test_rules_judge_the_first_answers(rule: str, stats: dict[str, str], stops: bool) -> None:
    assert (judge(stats, [parse_rule(rule)], after=50) is not None) is stops


@pytest.mark.parametrize("bad", ["truncated", "speed>0.2", "truncated<0.2", "truncated>2",
                                 "empty>150%"])
def test_a_bad_rule_is_a_one_line_error(bad: str, tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "x"}])
    done = cli("produce", str(prompts), "--run", "bad", "--context-length", "512",
               "--stop-if", bad, "--redis", "redis://127.0.0.1:1")
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "--stop-if" in done.stderr
