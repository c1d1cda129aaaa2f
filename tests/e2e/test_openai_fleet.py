"""A whole run on OpenAI-protocol servers (the simulator as vLLM 0.33): the producer reads the
context and detects the protocol, real workers detect it too, every budget follows vLLM's
rule, every answer is checked; a wrong protocol choice is one line at start-up."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetgen import exitcodes
from fleetgen.cli import main as cli
from fleetgen.local.fleet import LocalFleet
from tests.support.content import assert_fleet_content
from tests.support.fleet import sim_fleet
from tests.support.pipeline import assert_exactly_once, make_prompts, run_pipeline
from tests.support.workers import start_worker

CTX = 4096


@pytest.fixture(scope="module")
def vllm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    fleet = sim_fleet(tmp_path_factory.mktemp("vllm"), gpus=2, context_length=CTX,
                      max_running_requests=8, ttft_ms=2, tpot_ms=0.02, output_tokens_mean=300,
                      sim_args=["--flavor", "vllm"], concurrency=9)
    fleet.start()
    yield fleet
    fleet.stop()


def test_a_run_on_vllm_servers_uses_vllms_rule_and_every_answer_checks(
        vllm_fleet: LocalFleet, tmp_path: Path) -> None:
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 120, too_long=2, long_tokens=6000)
    urls = tuple(vllm_fleet.engine_url(g) for g in range(2))
    summary = run_pipeline(vllm_fleet, prompts, "vllm", out, context_length=None,
                           engine_url=urls)
    data = assert_exactly_once(out, set(kinds["good"]) | set(kinds["too_long"]))
    assert summary["done"] == 120 and summary["failed"] == 0
    for r in data["results"]:
        # vLLM clamps at context - prompt and refuses only prompt >= context: the whole rest.
        assert r["max_tokens"] == CTX - r["prompt_tokens"], r["id"]
        assert r["attempts"] == 1
    assert {r["reason"].split(":")[0] for r in data["rejected"]} == {"prompt_too_long"}
    assert assert_fleet_content(vllm_fleet, prompts, data) == 120


def test_stop_strings_on_vllm_servers_end_answers_as_vllm_does(
        vllm_fleet: LocalFleet, tmp_path: Path) -> None:
    """vLLM cuts the text it returns before the first stop string (`StopChecker.
    check_stop_strings`) and names it in `stop_reason`: the results say `stop`, hold no stop
    string, and are each the simulator's answer."""
    prompts, out = tmp_path / "p.jsonl", tmp_path / "out"
    kinds = make_prompts(prompts, 30)
    urls = tuple(vllm_fleet.engine_url(g) for g in range(2))
    stops = [" about", " finally"]
    run_pipeline(vllm_fleet, prompts, "vllm-stop", out, context_length=None, engine_url=urls,
                 sampling={"stop": stops})
    data = assert_exactly_once(out, set(kinds["good"]))
    results = data["results"]
    assert not [r for r in results for s in stops
                if s in r["completion"] or s in (r.get("reasoning") or "")]
    assert sum(r["finish_reason"] == "stop" for r in results) > len(results) // 2
    assert assert_fleet_content(vllm_fleet, prompts, data, sampling={"stop": stops}) == 30


def test_a_worker_told_sglang_in_front_of_vllm_stops_with_one_line(
        vllm_fleet: LocalFleet, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(vllm_fleet.redis_url, vllm_fleet.engine_url(0), "wrong", log,
                        env={"FLEETGEN_ENGINE_PROTOCOL": "sglang"})
    assert proc.wait(timeout=60) == exitcodes.CONFIG
    lines = [line for line in log.read_text().splitlines() if "fleetgen worker:" in line]
    assert len(lines) == 1 and "does not speak SGLang's native protocol" in lines[0], lines
    assert "Traceback" not in log.read_text()


def test_an_unknown_protocol_name_is_one_line(vllm_fleet: LocalFleet, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(vllm_fleet.redis_url, vllm_fleet.engine_url(0), "bogus", log,
                        env={"FLEETGEN_ENGINE_PROTOCOL": "grpc"}, concurrency=2)
    assert proc.wait(timeout=60) == exitcodes.CONFIG
    assert "unknown engine protocol 'grpc'" in log.read_text()
    assert "Traceback" not in log.read_text()


def test_the_producer_refuses_a_url_that_answers_neither_protocol(
        vllm_fleet: LocalFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    make_prompts(prompts, 3)
    neither = subprocess.Popen(["python3", "-m", "http.server", "0", "--bind", "127.0.0.1",
                                "--directory", str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        assert neither.stdout is not None
        port = int(neither.stdout.readline().split(" port ")[1].split()[0])
        code = cli.main(["produce", str(prompts), "--run", "neither", "--redis",
                         vllm_fleet.redis_url, "--engine-url", f"http://127.0.0.1:{port}"])
    finally:
        neither.terminate()
        neither.wait(timeout=10)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == exitcodes.CONFIG, err
    assert len(err) == 1 and "answers neither SGLang's native protocol" in err[0], err
