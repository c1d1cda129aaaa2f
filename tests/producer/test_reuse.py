"""producer/reuse.py: which earlier answers (an estimate's sample) stand for a run's requests,
row by row and sample by sample; and, on a real Valkey with the real drainer and no worker,
that the reused rows are never queued, land in results.jsonl once each, and stay once each
when Redis loses their done bits and the pass reuses them again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import redis

from fleetgen.drainer import Drainer
from fleetgen.queue.contract import QUEUE, TaskPayload
from fleetgen.records.outcomes import ids_digest
from fleetgen.runstate.keys import RunKeys
from producer.build import build_producer
from producer.inputs import resolve_input
from producer.loop import Plan
from producer.reuse import (
    PROVENANCE,
    RUN,
    SCRATCH,
    EarlierAnswers,
    Source,
    candidates,
    samples_in,
    settings_difference,
    why_not,
)
from producer.settings import ProducerSettings
from producer.tokenizer import load_tokenizer

IDS = [1, 2, 3]


def payload(max_tokens: int = 100, **more: Any) -> TaskPayload:
    return TaskPayload(run="r", line=7, id="a", input_ids=IDS, max_tokens=max_tokens,
                       sampling={}, row={"prompt": "q", "k": 1}, **more)  # type: ignore[typeddict-item]


def answer(tokens: int, finish: str = "stop", max_tokens: int = 4000, **more: Any
           ) -> dict[str, Any]:
    return {"prompt": "q", "k": 1, "id": "a", "completion": "x", "finish_reason": finish,
            "completion_tokens": tokens, "max_tokens": max_tokens, "line": 3, **more}


def test_an_answer_stands_only_for_the_same_prompt_within_the_budget() -> None:
    same = ids_digest(IDS)
    assert why_not(answer(40), same, payload(100)) is None
    assert why_not(answer(100), same, payload(100)) is None  # stopped at exactly the cap
    assert why_not(answer(101), same, payload(100)) == "longer than this run's budget"
    # Cut by the estimate's budget: the run's answer only where its budget is that one.
    assert why_not(answer(100, "length", 100), same, payload(100)) is None
    assert why_not(answer(100, "length", 100), same, payload(200)) == \
        "cut by a smaller budget than this run's"
    assert why_not(answer(300, "length", 300), same, payload(200)) == \
        "longer than this run's budget"
    assert why_not(answer(40), ids_digest([9]), payload()) == "the prompt renders to other ids"
    assert why_not(answer(40), None, payload()) == "the prompt renders to other ids"
    assert why_not({**answer(40), "k": 2}, same, payload()) == "the row changed"


def test_a_reused_answer_is_this_runs_request() -> None:
    """The line, slot, sample and budget are this run's; the answer, and where it came
    from, the estimate's."""
    source = Source(Path("est/run"), {("a", 1): answer(40, sample=1, slot=3)},
                    {"a": ids_digest(IDS)})
    reuse = EarlierAnswers([source])
    send, reused = reuse.split([payload(100, sample=1, slot=15), payload(100, sample=2,
                                                                         slot=16)])
    assert [p["slot"] for p in send] == [16]  # sample 2 has no earlier answer
    (record,) = reused
    assert record["line"] == 7 and record["slot"] == 15 and record["sample"] == 1
    assert record["max_tokens"] == 100 and record["completion"] == "x"
    assert record["reused"] == "est/run" and record["k"] == 1 and reuse.taken == 1
    send, reused = reuse.split([payload(30, sample=1, slot=15)])
    assert not reused and reuse.declined_words() == "1 longer than this run's budget"


def test_the_settings_that_make_an_answer_must_match() -> None:
    run = {"tokenizer": "qwen3.6", "sampling": {}, "n": 1, "turns": "last",
           "max_output_tokens": 2048, "context_length": 4096}
    assert settings_difference({**run, "max_output_tokens": None}, run) is None  # per row
    assert settings_difference({**run, "sampling": {"temperature": 0.5}}, run) == \
        'the estimate ran with sampling options {"temperature":0.5}, this run with {}'
    assert settings_difference({**run, "n": 4}, run) == \
        "the estimate ran with --n 4, this run with 1"


def write_sample(out: Path, settings: dict[str, Any], servers: dict[str, Any],
                 answers: list[dict[str, Any]], prompts: dict[str, str]) -> Path:
    run = out / SCRATCH / "k1" / RUN
    run.mkdir(parents=True)
    (run / "summary.json").write_bytes(orjson.dumps({"run": "estimate", "settings": settings}))
    (run / "results.jsonl").write_bytes(b"".join(orjson.dumps(a) + b"\n" for a in answers))
    (run.parent / PROVENANCE).write_bytes(orjson.dumps({"servers": servers,
                                                        "prompts": prompts}))
    return run


def test_a_sample_of_other_servers_or_settings_is_not_reused_and_says_why(
        tmp_path: Path) -> None:
    settings = {"tokenizer": "qwen3.6", "sampling": {}, "n": 1}
    servers = {"protocol": "sglang", "engines": ["sglang"], "models": ["m1"]}
    run = write_sample(tmp_path, settings, servers, [answer(5)], {"a": ids_digest(IDS)})

    def found(settings: dict[str, Any], servers: dict[str, Any] | None,
              *dirs: Path) -> Any:
        return candidates(samples_in(dirs or [tmp_path]), settings).served_by(servers)

    same = found(settings, servers, tmp_path, tmp_path)  # one sample, found once
    assert same.reuse is not None and same.reuse.answers == 1 and len(same.notes) == 1
    other = found(settings, {**servers, "models": ["m2"]})
    assert other.reuse is None
    assert other.notes == [f"the estimate's answers in {run} are not reused: they came from "
                           "m1 (sglang, sglang protocol), this run's servers run m2 (sglang, "
                           "sglang protocol)"]
    # Other settings: said, and the servers need not be asked (no candidate is left).
    hot = candidates(samples_in([tmp_path]), {**settings, "sampling": {"temperature": 1.0}})
    assert not hot.samples and "sampling options {}" in hot.notes[0]
    (run.parent / PROVENANCE).unlink()
    old = candidates(samples_in([tmp_path]), settings)
    assert not old.samples and "does not say how they were made" in old.notes[0]
    assert found(settings, servers, tmp_path / "nothing").notes == []


def test_reused_rows_are_written_once_never_queued_even_when_redis_loses_their_bits(
        tmp_path: Path, redis_url: str, rclient: redis.Redis) -> None:
    prompts = [f"question number {i}" for i in range(6)]
    (tmp_path / "p.jsonl").write_text("".join(
        orjson.dumps({"id": f"r{i}", "prompt": p}).decode() + "\n"
        for i, p in enumerate(prompts)))
    settings = ProducerSettings(input=tmp_path / "p.jsonl", run="reuse", redis_url=redis_url,
                                context_length=4096)
    digests = {f"r{i}": ids_digest(ids) for i, ids in enumerate(
        load_tokenizer(settings.tokenizer).encode_batch(prompts))}
    earlier = {(f"r{i}", None): {"id": f"r{i}", "prompt": prompts[i], "completion": f"a{i}",
                                 "finish_reason": "stop", "completion_tokens": 5,
                                 "prompt_tokens": 4, "max_tokens": 4000, "line": i + 1}
               for i in range(4)}
    earlier[("r3", None)].update(finish_reason="length", max_tokens=5)  # cut short: not valid
    reuse = EarlierAnswers([Source(tmp_path / "est", earlier, digests)])
    out = tmp_path / "out"
    keys = RunKeys("reuse")

    def send_pass() -> None:
        plan = Plan(resolve_input(settings.input), reuse=reuse)
        build_producer(settings, client=rclient, plan=plan).send_pass()

    def drained() -> Drainer:
        drainer = Drainer(rclient, "reuse", out)
        drainer.recover()  # the files told to Redis: their done bits set again
        while drainer.step(block_ms=None):
            pass
        drainer.close()
        return drainer

    send_pass()
    drained()
    assert rclient.llen(QUEUE) == 3  # r3 (its earlier answer was cut short), r4, r5
    lines = [orjson.loads(x) for x in (out / "results.jsonl").read_bytes().splitlines()]
    assert sorted(r["id"] for r in lines) == ["r0", "r1", "r2"]
    assert all(r["reused"] == str(tmp_path / "est") for r in lines)
    assert reuse.declined_words() == "1 cut by a smaller budget than this run's"

    # Redis loses the run's bits and queue before the drainer looks: the next pass reuses the
    # three again; the drainer keeps the first of each, and counts each once.
    rclient.delete(keys.done, keys.sent, keys.written, QUEUE)
    send_pass()
    assert reuse.taken == 6 and rclient.llen(QUEUE) == 3
    drainer = drained()
    assert len((out / "results.jsonl").read_bytes().splitlines()) == 3
    assert drainer.counts()["reused"] == 3 and drainer.counts()["done"] == 3

    # A resume after a lost Redis: the drainer tells it what the files hold first, so the pass
    # reuses nothing and sends only the rows without a line.
    rclient.delete(keys.done, keys.sent, keys.written, QUEUE)
    drained()
    send_pass()
    assert reuse.taken == 6 and rclient.llen(QUEUE) == 3
