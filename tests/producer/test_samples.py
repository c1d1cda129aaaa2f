"""Several samples per prompt, per-row options and the reasoning flags, as the producer sends
them: every (row, sample) is a request with a slot of its own, numbered in input order, so the
run's bookkeeping counts requests and a resume sends none twice."""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from fleetgen.queue.contract import QUEUE, slot_of
from fleetgen.runstate.keys import RunKeys
from producer.build import standalone_producer
from producer.request import Request, RequestOptions, opens_reasoning, sample_seed
from producer.rows import Row
from producer.settings import ProducerSettings
from tests.support.content import tokenizer


def queued(client: redis.Redis) -> list[dict[str, Any]]:
    """The task payloads in the queue, in the order workers take them."""
    return [orjson.loads(base64.b64decode(orjson.loads(raw)["body"]))[0][0]
            for raw in client.lrange(QUEUE, 0, -1)[::-1]]


def rejections(client: redis.Redis, run: str) -> list[dict[str, Any]]:
    return [orjson.loads(fields[b"d"]) for _, fields in client.xrange(RunKeys(run).stream)]


def write_rows(path: Path) -> Path:
    rows = [b'{"id": "a", "messages": [{"role": "user", "content": "hello"}]}',
            b'{"id": "b", "prompt": "one two three"}',
            b"{not json",
            b'{"id": "d", "prompt": "' + b"word " * 300 + b'"}',  # too long for 256 tokens
            b'{"id": "e", "prompt": "the last one"}']
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


def settings(tmp_path: Path, redis_url: str, run: str, **kw: Any) -> ProducerSettings:
    return ProducerSettings(input=write_rows(tmp_path / "p.jsonl"), run=run,
                            redis_url=redis_url, context_length=256, max_output_tokens=32,
                            **kw)


def test_n_samples_are_requests_with_slots_in_input_order(
        tmp_path: Path, redis_url: str, rclient: redis.Redis) -> None:
    s = settings(tmp_path, redis_url, "samples", n=3, sampling={"temperature": 0.7, "seed": 5})
    producer = standalone_producer(s, tokenizer=tokenizer())
    producer.send_pass()
    payloads = queued(rclient)
    # 3 good rows x 3 samples; the bad line and the too-long row are 3 rejections each.
    assert [(p["id"], p["sample"], slot_of(p)) for p in payloads] == [
        ("a", 0, 1), ("a", 1, 2), ("a", 2, 3), ("b", 0, 4), ("b", 1, 5), ("b", 2, 6),
        ("e", 0, 13), ("e", 1, 14), ("e", 2, 15)]
    seeds = [p["sampling"]["seed"] for p in payloads]
    assert len(set(seeds)) == 9, "every sample has a seed of its own"
    assert seeds[1] == sample_seed("a", 1, 5)
    assert all(p["sampling"]["temperature"] == 0.7 for p in payloads)
    rejected = rejections(rclient, "samples")
    assert sorted((r["line"], r["sample"], slot_of(r)) for r in rejected) == [
        (3, 0, 7), (3, 1, 8), (3, 2, 9), (4, 0, 10), (4, 1, 11), (4, 2, 12)]
    assert all(r["reason"].startswith(("invalid_json", "prompt_too_long")) for r in rejected)
    keys = RunKeys("samples")
    assert producer.manifest()["total"] == "15"  # requests, not rows
    assert rclient.bitcount(keys.sent) == 15
    assert rclient.bitcount(keys.done) == 6  # the rejections are outcomes already
    # A resume sends nothing twice: every slot is queued or done.
    again = standalone_producer(s, tokenizer=tokenizer())
    progress = again.send_pass()
    assert progress.enqueued == 0 and progress.rejected == 0 and progress.skipped == 15
    assert rclient.llen(QUEUE) == 9


def test_one_sample_keeps_the_line_as_its_slot(tmp_path: Path, redis_url: str,
                                               rclient: redis.Redis) -> None:
    producer = standalone_producer(settings(tmp_path, redis_url, "single"), tokenizer=tokenizer())
    producer.send_pass()
    payloads = queued(rclient)
    assert [p["line"] for p in payloads] == [1, 2, 5]
    assert not any("sample" in p or "slot" in p for p in payloads)
    assert "seed" not in payloads[0]["sampling"]
    assert producer.manifest()["total"] == "5"


def row(**kw: Any) -> Row:
    return Row(line=4, id="r", messages=None, prompt="hi", **kw)


def options(tmp_path: Path, **kw: Any) -> RequestOptions:
    s = ProducerSettings(input=tmp_path / "x.jsonl", run="o", redis_url="redis://x",
                         context_length=256, **kw)
    return RequestOptions(s, tokenizer())


def test_row_options_override_the_run_and_the_budget_caps_them(tmp_path: Path) -> None:
    opts = options(tmp_path, sampling={"temperature": 0.2, "top_p": 0.9}, logprobs=5,
                   json_schema='{"type":"object"}')
    mine = row(sampling={"temperature": 1.1, "stop": ["END"]}, max_tokens=7,
               json_schema='{"type":"array"}')
    payload = opts.payload(mine, Request(4, None, 4), [1, 2], 7, "hi")
    assert payload["sampling"] == {"temperature": 1.1, "top_p": 0.9, "stop": ["END"]}
    assert payload["logprobs"] == 5
    assert payload["json_schema"] == '{"type":"array"}'  # the row's own schema wins
    plain = opts.payload(row(), Request(4, None, 4), [1, 2], 9, "hi")
    assert plain["json_schema"] == '{"type":"object"}'
    assert plain["sampling"] == {"temperature": 0.2, "top_p": 0.9}


def test_pipeline_caps_a_rows_max_tokens_by_the_budget(tmp_path: Path, redis_url: str,
                                                      rclient: redis.Redis) -> None:
    producer = standalone_producer(settings(tmp_path, redis_url, "cap"), tokenizer=tokenizer())
    big, small = row(max_tokens=10_000), row(max_tokens=3)
    batch = producer.prompts.batch()
    batch.add(big, [Request(4, None, 4)])
    batch.add(small, [Request(5, None, 5)])
    assert [p["max_tokens"] for p in batch.payloads()] == [32, 3]  # min(run cap 32, row's own)


def test_reasoning_flags(tmp_path: Path) -> None:
    auto = options(tmp_path)
    assert auto.split_reasoning, "</think> is one Qwen3.6 token: auto splits"
    assert not options(tmp_path, reasoning="off").split_reasoning
    opened = auto.payload(row(), Request(4, None, 4), [1], 8, "<|im_start|>assistant\n<think>\n")
    assert opened["think"] and opened["think_open"]
    closed = auto.payload(row(), Request(4, None, 4), [1], 8,
                          "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert closed["think"] and "think_open" not in closed
    assert not opens_reasoning("plain prompt")


def test_greedy_sampling_with_several_samples_warns(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fleetgen.producer"):
        options(tmp_path, n=4, sampling={"temperature": 0})
    assert "every sample of a row will be the same answer" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fleetgen.producer"):
        options(tmp_path, n=4, sampling={"temperature": 0.8})
    assert caplog.text == ""
