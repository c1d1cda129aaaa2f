"""A run over a directory of input files, on a real Valkey without workers: rows are numbered
across the files, rejections name their file and position, the file list is pinned in the
run's manifest and a resume that sees another list is refused in one line."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest
import redis

from fleetgen.errors import ConfigError
from fleetgen.queue.contract import QUEUE
from fleetgen.queue.wire import task_payload
from fleetgen.records.outcomes import read_entry
from fleetgen.runstate.keys import RunKeys
from producer.build import standalone_producer
from producer.manifest import check_same_settings, files_difference
from producer.settings import ProducerSettings


class CharTokenizer:
    """One token per character; plain `prompt` rows are never rendered."""

    name = "chars"

    def render(self, messages: object, template_kwargs: object = None) -> str:
        raise AssertionError("prompt rows are not rendered")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[7] * len(t) for t in texts]

    def count(self, text: str) -> int:
        return len(text)


def make_input(root: Path) -> Path:
    root.mkdir()
    (root / "a.jsonl").write_text('{"id": "a1", "prompt": "one"}\n{"id": "a2", "prompt": 2}\n')
    (root / "b.jsonl.gz").write_bytes(gzip.compress(
        b'{"id": "b1", "prompt": "three"}\n{"id": "a1", "prompt": "dup"}\n'
        + orjson.dumps({"id": "b3", "prompt": "x" * 500}) + b"\n"))
    return root


def settings(prompts: Path | str, redis_url: str, run: str = "files") -> ProducerSettings:
    return ProducerSettings(input=Path(prompts), run=run, redis_url=redis_url,
                            context_length=256, high_water=1000)


def produce(prompts: Path | str, redis_url: str, run: str = "files") -> None:
    standalone_producer(settings(prompts, redis_url, run), tokenizer=CharTokenizer()).send_pass()


def rejections(client: redis.Redis, run: str) -> dict[int, dict[str, object]]:
    records = {}
    for _, fields in client.xrange(RunKeys(run).stream):
        entry = read_entry(fields)
        assert entry is not None
        record = orjson.loads(entry[1])
        records[record["line"]] = record
    return records


def test_rows_are_numbered_across_files_and_rejections_name_file_and_position(
        tmp_path: Path, redis_url: str, rclient: redis.Redis) -> None:
    produce(make_input(tmp_path / "in"), redis_url)
    queued = sorted((p["line"], p["id"]) for raw in rclient.lrange(QUEUE, 0, -1)
                    if (p := task_payload(orjson.loads(raw))) is not None)
    assert queued == [(1, "a1"), (3, "b1")]
    got = rejections(rclient, "files")
    assert {line: (r["id"], r["file"], r["position"], str(r["reason"]).split(":")[0])
            for line, r in got.items()} == {
        2: ("a2", "a.jsonl", 2, "bad_prompt"),
        4: ("a1#4", "b.jsonl.gz", 2, "duplicate_id"),
        5: ("b3", "b.jsonl.gz", 3, "prompt_too_long"),
    }
    manifest = orjson.loads(rclient.hget(RunKeys("files").manifest, "settings") or b"{}")
    assert manifest["files"] == ["a.jsonl", "b.jsonl.gz"]
    assert rclient.hget(RunKeys("files").manifest, "total") == b"5"


def test_one_input_file_gives_rejections_without_a_file_field(
        tmp_path: Path, redis_url: str, rclient: redis.Redis) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "ok", "prompt": "x"}\n{"id": "bad"}\n')
    produce(prompts, redis_url, "single")
    [record] = rejections(rclient, "single").values()
    assert record["line"] == 2 and "file" not in record and "position" not in record


def test_a_resume_that_sees_another_file_list_is_refused_naming_the_difference(
        tmp_path: Path, redis_url: str, rclient: redis.Redis) -> None:
    root = make_input(tmp_path / "in")
    produce(root, redis_url)
    produce(root, redis_url)  # the same files: resumes (nothing left to send)
    (root / "0-new.jsonl").write_text('{"id": "n", "prompt": "new"}\n')
    with pytest.raises(ConfigError) as caught:
        produce(root, redis_url)
    message = str(caught.value)
    assert "\n" not in message
    assert "other input files: 1 new (0-new.jsonl)" in message and "--run" in message
    (root / "0-new.jsonl").unlink()
    (root / "b.jsonl.gz").unlink()
    with pytest.raises(ConfigError, match=r"1 gone \(b.jsonl.gz\)"):
        produce(root, redis_url)


def test_a_glob_is_pinned_by_the_files_it_matched(tmp_path: Path, redis_url: str) -> None:
    root = make_input(tmp_path / "in")
    produce(f"{root}/*.jsonl*", redis_url, "glob")
    (root / "c.jsonl").write_text('{"id": "c", "prompt": "late"}\n')
    with pytest.raises(ConfigError, match=r"1 new \(c.jsonl\)"):
        produce(f"{root}/*.jsonl*", redis_url, "glob")


def test_a_run_started_before_files_were_pinned_still_resumes() -> None:
    old = {"input": "/data/p.jsonl", "tokenizer": "qwen3.6"}
    check_same_settings("r", old, {**old, "files": ["p.jsonl"]})


def test_the_difference_of_long_lists_stays_one_short_line() -> None:
    old = [f"part-{i:05d}.jsonl" for i in range(1000)]
    new = old[2:] + [f"extra-{i}.jsonl" for i in range(5)]
    assert files_difference(old, new) == (
        "5 new (extra-0.jsonl, extra-1.jsonl, extra-2.jsonl and 2 more); "
        "2 gone (part-00000.jsonl, part-00001.jsonl)")


def test_the_recorded_size_is_the_inputs_before_the_pass_reads_it(redis_url: str,
                                                                  tmp_path: Path) -> None:
    """A row appended while the producer reads may be missed by that pass: the size the run
    records is the one before reading, so the next `produce` sees a change and reads again."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "r{i}", "prompt": "row {i}"}}\n' for i in range(8)))
    before = prompts.stat().st_size
    producer = standalone_producer(ProducerSettings(input=prompts, run="grow", redis_url=redis_url,
                                               context_length=256, high_water=1000,
                                               batch_size=2), tokenizer=CharTokenizer())

    def append_once(_: object) -> None:
        if prompts.stat().st_size == before:
            with prompts.open("a") as f:
                f.write('{"id": "late", "prompt": "appended while reading"}\n')

    producer.send_pass(on_batch=append_once)
    manifest = producer.run_manifest
    assert prompts.stat().st_size > before
    # The size before the pass read it: the next resume sees the appended row as a change.
    assert manifest.record.read().input_bytes == before
