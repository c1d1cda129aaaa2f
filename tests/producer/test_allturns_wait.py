"""`--turns all`'s wait (producer/allturns.py) ends only when the files have nothing more to
gain. A retried turn's answer recorded by its worker (retrying set emptied, the entry in the
stream) but not yet written by the drainer leaves the files showing the old failure, every
slot settled: a producer that ended then left the turns after it to no one, and the drainer
waited for them forever (the intermittent tests/chaos/test_turns_faults.py failure)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import redis

from fleetgen.records.outdir import OutputDir
from fleetgen.runstate.keys import RunKeys
from producer.build import standalone_producer
from producer.settings import ProducerSettings
from producer.tokenizer import QwenTokenizer


def _failure(slot: int) -> bytes:
    return orjson.dumps({"id": "c", "line": 1, "slot": slot, "turn": 1, "turns": 2,
                         "error": {"type": "engine"}, "attempts": 1}) + b"\n"


def test_the_wait_ends_only_once_the_drainer_has_written_every_recorded_outcome(
        redis_url: str, rclient: redis.Redis, tmp_path: Path,
        built_tokenizer: QwenTokenizer) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(orjson.dumps({"id": "c", "messages": [
        {"role": "user", "content": "first"}, {"role": "assistant", "content": "x"},
        {"role": "user", "content": "second"}]}) + b"\n")
    out = tmp_path / "out"
    settings = ProducerSettings(input=prompts, run="w", redis_url=redis_url,
                                context_length=4096, turns="all", out=out)
    producer = standalone_producer(settings, tokenizer=built_tokenizer)
    producer.send_pass()
    keys = RunKeys("w")
    # Turn 1 failed (its failure written: turn 2 held back, both slots settled), then a retry
    # answered it: the worker's outcome is in the stream, the drainer has not written it.
    out.mkdir(exist_ok=True)
    OutputDir(out).file("failure").write_bytes(_failure(1))
    rclient.xadd(keys.stream, {"k": "result", "d": b"{}"})
    started = time.monotonic()
    producer.wait_until_generated(0.2, should_stop=lambda: time.monotonic() - started > 1.5)
    assert time.monotonic() - started > 1.5, "ended with an outcome still on its way"
    # The stream written out (the drainer deletes what it wrote): the files are the truth.
    rclient.delete(keys.stream)
    started = time.monotonic()
    producer.wait_until_generated(0.2, should_stop=lambda: time.monotonic() - started > 10)
    assert time.monotonic() - started < 5
