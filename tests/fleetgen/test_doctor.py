"""`fleetgen doctor` against simulated SGLang servers in each of their modes, over real HTTP:
the values it prints, its verdict and its exit code."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetgen.base import exitcodes
from fleetgen.cli.doctor import COLUMNS, DISAGREES
from fleetgen.cli.main import main
from simulator import SimConfig, SimThread, run_in_thread

StartSim = Callable[..., SimThread]
EAGLE = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 4,
         "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6}


@pytest.fixture
def start_sim() -> Iterator[StartSim]:
    handles: list[SimThread] = []

    def start(**overrides: object) -> SimThread:
        settings: dict[str, object] = {"port": 0, "ttft_ms": 0.0, "tpot_ms": 0.0,
                                       "health_delay_s": 0.0, "context_length": 4096}
        settings.update(overrides)
        handles.append(run_in_thread(SimConfig(**settings)))  # type: ignore[arg-type]
        return handles[-1]

    yield start
    for handle in handles:
        handle.stop()


def doctor(capsys: pytest.CaptureFixture[str], *urls: str, json_out: bool = False,
           ) -> tuple[int, str]:
    argv = ["doctor", *(a for u in urls for a in ("--engine-url", u))]
    code = main([*argv, "--json"] if json_out else argv)
    return code, capsys.readouterr().out


def row(out: str, url: str) -> dict[str, str]:
    """The table row of `url`, by column name."""
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0] == url:
            names = ["server", "model", "context", "input", "reserve", "running", "-c",
                     "deterministic", "text"]
            assert len(names) == len(COLUMNS)
            return dict(zip(names, cells, strict=True))
    raise AssertionError(f"no row for {url} in:\n{out}")


MODES: list[tuple[str, dict[str, Any], int, dict[str, str], list[str]]] = [
    ("plain", {}, exitcodes.OK,
     {"context": "4096", "input": "4090", "reserve": "0", "running": "64", "-c": "65",
      "deterministic": "no", "text": "yes"},
     ["refuses a 4090-token input: 400 Input length (4090 tokens)", "verdict: ok",
      "note: --seed is not honoured"]),
    ("derived-slots", {"derived_slots": 24}, exitcodes.OK,
     {"running": "24", "-c": "25"}, ["verdict: ok"]),
    ("speculative", EAGLE, exitcodes.OK,
     {"input": "4088", "reserve": "8", "running": "48", "-c": "49"},
     ["refuses a 4088-token input: 400 The input (4096 tokens) is longer than the model's "
      "context length", "context 4096, reserve 8 as reported", "verdict: ok"]),
    ("deterministic", {"enable_deterministic_inference": True}, exitcodes.OK,
     {"deterministic": "yes"}, ["verdict: ok"]),
    ("skip-tokenizer-init", {"skip_tokenizer_init": True}, DISAGREES,
     {"text": "no"}, ["FAIL", "--skip-tokenizer-init", "verdict: FAIL"]),
    ("auto-truncate", {"allow_auto_truncate": True}, DISAGREES,
     {"input": "4090"}, ["FAIL", "refuses a 4090-token input: accepted it",
                         "--allow-auto-truncate", "verdict: FAIL"]),
]


@pytest.mark.parametrize(("mode", "overrides", "code", "values", "lines"), MODES,
                         ids=[m[0] for m in MODES])
def test_doctor_in_each_simulator_mode(start_sim: StartSim, capsys: pytest.CaptureFixture[str],
                                       mode: str, overrides: dict[str, Any], code: int,
                                       values: dict[str, str], lines: list[str]) -> None:
    sim = start_sim(**overrides)
    got, out = doctor(capsys, sim.url)
    assert got == code, out
    printed = row(out, sim.url)
    assert {k: printed[k] for k in values} == values, out
    assert printed["model"] == "fleetgen-sim" and printed["context"] == "4096"
    for needle in lines:
        assert needle in out, out
    if overrides.get("enable_deterministic_inference"):
        assert "--seed is not honoured" not in out


def test_two_servers_with_different_contexts_disagree(start_sim: StartSim,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    small, large = start_sim(context_length=4096), start_sim(context_length=8192)
    code, out = doctor(capsys, small.url, large.url)
    assert code == DISAGREES, out
    assert row(out, small.url)["context"] == "4096" and row(out, large.url)["context"] == "8192"
    assert "the producer budgets for: context 4096, input limit 4090, reserve 0" in out
    assert f"FAIL servers' context: they disagree: 4096 ({small.url}), 8192 ({large.url})" \
        in out


def test_an_unreachable_server_is_one_line_and_exit_4(start_sim: StartSim,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim()
    dead = "http://127.0.0.1:9"
    code, out = doctor(capsys, sim.url, dead)
    assert code == exitcodes.UNAVAILABLE, out
    about_dead = [line for line in out.splitlines()
                  if dead in line and not line.startswith(dead)]
    assert len(about_dead) == 1 and about_dead[0].startswith("FAIL"), out
    assert row(out, sim.url)["context"] == "4096"  # the reachable one is still reported


def test_json_output(start_sim: StartSim, capsys: pytest.CaptureFixture[str]) -> None:
    sim = start_sim(**EAGLE)
    code, out = doctor(capsys, sim.url, json_out=True)
    doc = json.loads(out)
    assert code == doc["exit_code"] == exitcodes.OK
    server = doc["servers"][0]
    assert server["limits"]["reserved_tokens"] == 8 and server["input_limit"] == 4088
    assert server["concurrency"] == 49 and all(c["ok"] for c in server["checks"])
    assert doc["assumed"]["context_length"] == 4096


class NoContext(BaseHTTPRequestHandler):
    """A server that answers but reports no context length anywhere."""

    def do_GET(self) -> None:  # http.server calls it by this name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "m"}]}' if self.path == "/v1/models" else b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_without_a_context_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), NoContext)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, out = doctor(capsys, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert code == exitcodes.CONFIG, out
    assert "reports no context length" in out


def test_check_uses_the_instant_readiness_probe(start_sim: StartSim, redis_url: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang's /health generates a token and takes >= 1 s; `check` must not wait on it."""
    sim = start_sim(health_delay_s=30.0)
    code = main(["check", "--redis", redis_url, "--engine-url", sim.url, "--timeout-s", "2"])
    out = capsys.readouterr().out
    assert code == exitcodes.OK, out
    assert f"ok   engine: {sim.url}/ready 200" in out
