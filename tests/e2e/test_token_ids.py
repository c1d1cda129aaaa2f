"""`--token-ids` and `fleetgen export --format tokens` end to end, through the real CLI: real
Valkey, Celery workers and simulated thinking-model servers (SGLang's native protocol, and
vLLM's /v1/completions), then the export after `fleetgen purge`. Every output id is the
simulator's own; every exported line is the producer's prompt ids then those, masked 0 then
1 (the trainers' own loaders judge the export in tests/trainers). Also measures the bytes
per token `output_ids` adds to results.jsonl (docs/formats.md "Token ids")."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleetgen import exitcodes
from fleetgen.local.fleet import LocalFleet
from fleetgen.local.simgpus import SimGpus
from tests.support.content import assert_fleet_content, input_rows, tokenizer
from tests.support.fleet import started_fleet
from tests.support.httpd import serving
from tests.support.pipeline import assert_exactly_once

RUN_KWARGS = {"enable_thinking": False}  # the run's; some rows ask for thinking themselves
THINK_CLOSE = "<think>\n\n</think>\n\n"  # Qwen3.6's generation prompt with thinking off


@pytest.fixture(scope="module")
def sglang_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    yield from started_fleet(tmp_path_factory.mktemp("tokens-sglang"), gpus=2,
                             output_tokens_mean=60, sim_args=["--thinking"])


def without_ids(record: dict[str, Any]) -> dict[str, Any]:
    """The record as it would be without --token-ids (the drainer writes orjson's bytes)."""
    return {k: v for k, v in record.items() if k not in ("output_ids", "prompt_ids_digest")}


def fleetgen(*args: str, redis: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetgen", *args], capture_output=True,
                          text=True, timeout=240,
                          env=dict(os.environ, FLEETGEN_REDIS_URL=redis))


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"{done.args[3:5]}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


def write_prompts(path: Path) -> Path:
    """Every prompt shape the producer reads, a row asking for thinking over the run's
    `enable_thinking: false`, a row sampled twice, and rows that never reach an engine."""
    rows: list[dict[str, Any]] = []
    for i in range(18):
        turns = [{"role": "user", "content": f"Question {i}: what is {i} x 7? 数据 😀"}]
        if i % 3 == 0:
            turns.append({"role": "assistant", "content": "an old answer, dropped"})
        shape = i % 4
        if shape == 0:
            rows.append({"id": f"m{i}", "messages": turns, "k": i})
        elif shape == 1:
            rows.append({"id": f"s{i}", "conversations": [
                {"from": "human" if t["role"] == "user" else "gpt", "value": t["content"]}
                for t in turns]})
        elif shape == 2:
            rows.append({"id": f"t{i}", "messages": turns,
                         "chat_template_kwargs": {"enable_thinking": True}})
        else:
            rows.append({"id": f"p{i}", "prompt": f"Continue the story {i}:"})
    rows.append({"id": "twice", "messages": [{"role": "user", "content": "Say it twice."}],
                 "sampling": {"n": 2, "temperature": 0.7}})
    lines = [orjson.dumps(r) for r in rows]
    lines.append(orjson.dumps({"id": "long", "prompt": "lorem ipsum dolor " * 4000}))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


EXPECTED = {*(f"{'mstp'[i % 4]}{i}" for i in range(18)), "twice#0", "twice#1", "long"}


def produce_and_drain(fleet: LocalFleet, prompts: Path, run: str, out: Path,
                      *flags: str) -> dict[str, list[dict[str, Any]]]:
    """Limits from every server (with --token-ids each is probed for ids first)."""
    servers = [arg for g in range(fleet.spec.gpus) for arg in ("--engine-url",
                                                               fleet.engine_url(g))]
    ok(fleetgen("produce", str(prompts), "--run", run, "--max-output-tokens", "96",
                "--chat-template-kwargs", json.dumps(RUN_KWARGS), *servers, *flags,
                redis=fleet.redis_url))
    ok(fleetgen("drain", "--run", run, "--out", str(out), redis=fleet.redis_url))
    return assert_exactly_once(out, EXPECTED)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def output_ids_bytes_per_token(out: Path) -> tuple[float, float, int]:
    """(bytes per output token --token-ids adds to results.jsonl: `output_ids` and
    `prompt_ids_digest`; bytes per output token of the whole file; output tokens), measured on
    the file the drainer wrote."""
    raw = (out / "results.jsonl").read_bytes()
    records = [orjson.loads(line) for line in raw.splitlines()]
    tokens = sum(r["completion_tokens"] for r in records)
    added = sum(len(orjson.dumps(r)) - len(orjson.dumps(without_ids(r))) for r in records)
    return added / tokens, len(raw) / tokens, tokens


def check_tokens_lines(lines: list[dict[str, Any]], results: list[dict[str, Any]],
                       prompts: Path) -> None:
    """Each line: the producer's own prompt ids for its row, then the answer's output ids;
    the mask 0 over the one and 1 over the other; in input order, one per answer."""
    ordered = sorted(results, key=lambda r: (r["line"], r.get("sample", -1)))
    assert [(x["id"], x.get("sample")) for x in lines] == \
        [(r["id"], r.get("sample")) for r in ordered]
    sent = input_rows(prompts, {r["id"] for r in results},
                      template_kwargs=json.dumps(RUN_KWARGS))
    for line, result in zip(lines, ordered, strict=True):
        prompt, _ = sent[result["id"]]
        assert line["input_ids"] == prompt + result["output_ids"], result["id"]
        assert line["loss_mask"] == [0] * len(prompt) + [1] * len(result["output_ids"])
        assert sum(line["loss_mask"]) == result["completion_tokens"] > 0
        assert line["finish_reason"] == result["finish_reason"]
        assert set(line) <= {"id", "sample", "input_ids", "loss_mask", "finish_reason",
                             "unfinished"}


def test_token_ids_through_a_run_and_its_tokens_export(sglang_fleet: LocalFleet,
                                                       tmp_path: Path) -> None:
    prompts, out = write_prompts(tmp_path / "p.jsonl"), tmp_path / "out"
    data = produce_and_drain(sglang_fleet, prompts, "tokens", out, "--token-ids")
    results = data["results"]
    assert len(results) == 20
    assert [r["reason"].split(":")[0] for r in data["rejected"]] == ["prompt_too_long"]
    # The output ids are the simulator's own answer, token for token (tests/support/content.py).
    assert assert_fleet_content(sglang_fleet, prompts, data, template_kwargs=RUN_KWARGS,
                                options={"think": True, "token_ids": True}) == 20
    per_token, whole, tokens = output_ids_bytes_per_token(out)
    print(f"\n--token-ids adds {per_token:.2f} bytes per output token to "
          f"results.jsonl ({whole:.1f} bytes per output token for the whole file, "
          f"{tokens} output tokens, SGLang simulator)")
    # Up to 6 digits and a comma a token (a 248k vocabulary), plus 39 bytes a line of digest
    # over these short (~50-token) answers.
    assert 2.0 < per_token < 9.0

    ok(fleetgen("purge", "--run", "tokens", redis=sglang_fleet.redis_url))
    done = ok(fleetgen("export", str(out), "--format", "tokens", "--include-unfinished",
                       redis=sglang_fleet.redis_url))
    assert "20 lines" in done.stdout
    lines = read_jsonl(out / "export.tokens.jsonl")
    check_tokens_lines(lines, results, prompts)
    # A row's own chat_template_kwargs went over the run's: its prompt opens a think block.
    rendered = [(x["id"], tokenizer().decode(x["input_ids"][:x["loss_mask"].index(1)]))
                for x in lines if x["id"][0] in "mst" and x["id"][1:].isdigit()]
    assert len(rendered) == 14
    for row_id, text in rendered:
        assert text.endswith("<think>\n" if row_id[0] == "t" else THINK_CLOSE), row_id

    ok(fleetgen("export", str(out), "--format", "tokens", "--include-unfinished", "--out",
                str(tmp_path / "t.parquet"),
                redis=sglang_fleet.redis_url))
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.schema.field("input_ids").type.value_type == pa.int32()
    assert [{k: v for k, v in r.items() if v is not None} for r in table.to_pylist()] == lines


def test_tokens_export_refuses_what_it_cannot_vouch_for(sglang_fleet: LocalFleet,
                                                        tmp_path: Path) -> None:
    prompts, redis = write_prompts(tmp_path / "p.jsonl"), sglang_fleet.redis_url
    plain = tmp_path / "plain"
    data = produce_and_drain(sglang_fleet, prompts, "no-ids", plain)
    assert not [r for r in data["results"] if "output_ids" in r]
    refused = fleetgen("export", str(plain), "--format", "tokens", redis=redis)
    assert refused.returncode == exitcodes.CONFIG
    assert refused.stderr.count("\n") == 1 and "without --token-ids" in refused.stderr
    assert not (plain / "export.tokens.jsonl").exists()

    # A result whose prompt no longer renders to the ids that were sent: named, nothing
    # written. The edit keeps the token count, so only the ids' digest can tell.
    with_ids = tmp_path / "ids"
    produce_and_drain(sglang_fleet, prompts, "ids", with_ids, "--token-ids")
    changed = tmp_path / "changed"
    shutil.copytree(with_ids, changed)
    records = read_jsonl(changed / "results.jsonl")
    victim = next(r for r in records if r["id"] == "m4")
    victim["messages"][0]["content"] = victim["messages"][0]["content"].replace("4 x", "5 x")
    (changed / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    mismatch = fleetgen("export", str(changed), "--format", "tokens", redis=redis)
    assert mismatch.returncode == exitcodes.CONFIG, mismatch.stderr
    assert "row 'm4'" in mismatch.stderr and "Traceback" not in mismatch.stderr
    assert not (changed / "export.tokens.jsonl").exists()


class NoIdsServer(http.server.BaseHTTPRequestHandler):
    """An OpenAI-protocol server that ignores `return_token_ids`, as vLLM releases from
    before it do (extra request fields are dropped with a warning): limits and completions,
    no token ids."""

    def do_GET(self) -> None:
        self._json({"object": "list", "data": [{"id": "old", "object": "model",
                                                "owned_by": "vllm", "max_model_len": 8192}]}
                   if self.path == "/v1/models" else {}, 200 if self.path != "/props" else 404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._json({"id": "cmpl-1", "object": "text_completion", "model": "old",
                    "choices": [{"index": 0, "text": "hi", "finish_reason": "length",
                                 "logprobs": None}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}})

    def _json(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_without_token_ids_is_refused_at_start(sglang_fleet: LocalFleet,
                                                        tmp_path: Path) -> None:
    with serving(NoIdsServer) as url:
        prompts = write_prompts(tmp_path / "p.jsonl")
        args = ("produce", str(prompts), "--run", "refused", "--engine-url", url,
                "--engine-protocol", "openai", "--no-wait")
        refused = fleetgen(*args, "--token-ids", redis=sglang_fleet.redis_url)
        assert refused.returncode == exitcodes.CONFIG, refused.stderr
        assert refused.stderr.count("\n") == 1 and "cannot return token ids" in refused.stderr
        assert url in refused.stderr
        # Without the flag the same server is fine: the refusal is the flag's.
        plain = fleetgen(*args[:3], "refused-plain", *args[4:], redis=sglang_fleet.redis_url)
        assert plain.returncode == 0, plain.stderr


@pytest.fixture(scope="module")
def vllm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    yield from started_fleet(tmp_path_factory.mktemp("tokens-vllm"), gpus=1, concurrency=9,
                             output_tokens_mean=60, sim_args=["--thinking", "--flavor", "vllm"])


def test_token_ids_on_vllms_openai_protocol(vllm_fleet: LocalFleet, tmp_path: Path) -> None:
    """/v1/completions with `return_token_ids` (the start-up probe passes first), then the
    same export: ids as the vLLM-flavoured simulator generated them."""
    prompts, out = write_prompts(tmp_path / "p.jsonl"), tmp_path / "out"
    data = produce_and_drain(vllm_fleet, prompts, "tokens-vllm", out, "--token-ids")
    assert assert_fleet_content(vllm_fleet, prompts, data, template_kwargs=RUN_KWARGS,
                                options={"think": True, "token_ids": True}) == 20
    ok(fleetgen("export", str(out), "--format", "tokens", "--include-unfinished",
                redis=vllm_fleet.redis_url))
    check_tokens_lines(read_jsonl(out / "export.tokens.jsonl"), data["results"], prompts)


def test_demo_keeps_token_ids_too(tmp_path: Path) -> None:
    """`fleetgen demo --token-ids` (its own Valkey, simulators and workers) and the export."""
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    prompts.write_bytes(b"".join(orjson.dumps(
        {"id": f"d{i}", "messages": [{"role": "user", "content": f"Tell me about {i}."}]}
        if i % 2 else {"id": f"d{i}", "prompt": f"Number {i} is"}) + b"\n" for i in range(12)))
    demo = subprocess.run([sys.executable, "-m", "fleetgen", "demo", "--gpus", "1",
                           "--prompts", str(prompts), "--out", str(out), "--tpot-ms", "0.05",
                           "--output-tokens-mean", "40", "--token-ids",
                           "--chat-template-kwargs", json.dumps(RUN_KWARGS)],
                          capture_output=True, text=True, timeout=240)
    assert demo.returncode == 0, demo.stderr[-3000:]
    data = assert_exactly_once(out, {f"d{i}" for i in range(12)})
    demo_gpus = SimGpus(gpus=1, context_length=8192, max_running_requests=32, tpot_ms=0.05,
                        output_tokens_mean=40)
    assert assert_fleet_content(demo_gpus, prompts, data, template_kwargs=RUN_KWARGS,
                                options={"think": True, "token_ids": True}) == 12
    done = subprocess.run([sys.executable, "-m", "fleetgen", "export", str(out), "--format",
                           "tokens", "--include-unfinished"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    check_tokens_lines(read_jsonl(out / "export.tokens.jsonl"), data["results"], prompts)
