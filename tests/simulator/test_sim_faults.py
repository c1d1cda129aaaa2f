"""Fault injection over real HTTP: error rates, drops, hangs, downtime and a crash."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.sim import ENDLESS, StartSim, generate, stats
from tests.support.waiting import wait_until


def http_exception_body(status: int, message: str) -> dict[str, object]:
    return {"object": "error", "message": message, "type": str(status), "param": None,
            "code": status}


def test_error_rate_is_roughly_honoured(start_sim: StartSim) -> None:
    sim = start_sim(error_rate=0.2, seed=11)
    codes: Counter[int] = Counter()
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        for i in range(500):
            response = generate(client, [i], 2)
            codes[response.status_code] += 1
            if response.status_code >= 500:
                body = response.json()
                assert body == http_exception_body(response.status_code, body["message"])
        assert stats(client)["faults_total"] == {"error": 500 - codes[200]}
    errors = 500 - codes[200]
    assert 75 <= errors <= 125
    assert set(codes) - {200} <= {500, 502, 503, 504}
    assert len(set(codes) - {200}) >= 3  # more than one kind of 5xx


def test_queue_full_rate_answers_sglangs_503(start_sim: StartSim) -> None:
    sim = start_sim(queue_full_rate=0.3, seed=5)
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        responses = [generate(client, [i], 2) for i in range(300)]
    full = [r for r in responses if r.status_code == 503]
    assert 60 <= len(full) <= 120
    assert len(full) + sum(r.status_code == 200 for r in responses) == 300
    assert full[0].json() == http_exception_body(503, "The request queue is full.")


def test_faults_never_hide_length_errors(start_sim: StartSim) -> None:
    sim = start_sim(context_length=100, error_rate=0.5, drop_rate=0.5)
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        for _ in range(20):
            assert generate(client, [1] * 120, 1).status_code == 400


def test_drop_closes_the_connection_without_an_answer(start_sim: StartSim) -> None:
    sim = start_sim(drop_rate=1.0)
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        for _ in range(3):
            with pytest.raises(httpx.RemoteProtocolError):
                generate(client, [1], 2)
        assert stats(client)["requests_total"] == {"dropped": 3}


def test_drop_rate_mixes_with_answers(start_sim: StartSim) -> None:
    sim = start_sim(drop_rate=0.25, seed=2)
    dropped = 0
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        for i in range(200):
            try:
                generate(client, [i], 2).raise_for_status()
            except httpx.RemoteProtocolError:
                dropped += 1
    assert 30 <= dropped <= 70


def test_hang_lasts_until_the_client_gives_up(start_sim: StartSim) -> None:
    sim = start_sim(hang_rate=1.0)
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            client.post("/generate", json={"input_ids": [1]}, timeout=0.5)
        assert time.monotonic() - started >= 0.5
        wait_until(lambda: stats(client)["requests_total"] == {"499": 1}, what="hang given up")
        assert stats(client)["faults_total"] == {"hang": 1}


def test_a_hung_request_can_be_aborted(start_sim: StartSim) -> None:
    sim = start_sim(hang_rate=1.0)
    with httpx.Client(base_url=sim.url, timeout=5) as client, ThreadPoolExecutor(1) as pool:
        hung = pool.submit(generate, client, [1], 5, rid="stuck")
        wait_until(lambda: stats(client)["faults_total"] == {"hang": 1}, what="hang")
        client.post("/abort_request", json={"rid": "stuck"}).raise_for_status()
        meta = hung.result().json()["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"


def test_admin_down_then_back_up(start_sim: StartSim) -> None:
    sim = start_sim()
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        assert client.get("/health").status_code == 200
        assert client.post("/_sim/down", json={"seconds": 0.5}).status_code == 200
        assert client.get("/health").status_code == 503
        refused = generate(client, [1], 2)
        assert refused.status_code == 503
        assert refused.json()["code"] == 503
        assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 503
        wait_until(lambda: client.get("/health").status_code == 200, what="back up")
        assert generate(client, [1], 2).status_code == 200
        client.post("/_sim/down", json={"seconds": 3600}).raise_for_status()
        assert client.get("/health").status_code == 503
        client.post("/_sim/up").raise_for_status()
        assert client.get("/health").status_code == 200
        assert client.post("/_sim/down", json={"seconds": -1}).status_code == 400


def test_configured_down_window(start_sim: StartSim) -> None:
    sim = start_sim(down_windows=[(0.0, 0.6), (3600.0, 7200.0)])
    with httpx.Client(base_url=sim.url, timeout=5) as client:
        assert client.get("/health").status_code == 503
        assert generate(client, [1], 2).status_code == 503
        wait_until(lambda: client.get("/health").status_code == 200, what="window over")
        assert generate(client, [1], 2).status_code == 200
        assert stats(client)["uptime_s"] >= 0.6


def test_die_after_closes_the_port(start_sim: StartSim) -> None:
    started = time.monotonic()
    sim = start_sim(die_after_s=1.0)

    def refused() -> bool:
        try:
            httpx.get(f"{sim.url}/health", timeout=2)
        except httpx.ConnectError:
            return True
        except (httpx.ReadError, httpx.RemoteProtocolError):
            return False  # the crash cut this probe mid-answer; the next one must be refused
        return False

    wait_until(refused, what="the port to close")
    assert time.monotonic() - started >= 1.0
    assert sim.fleet.servers[0].availability.dead


def test_a_dying_server_cuts_requests_in_flight(start_sim: StartSim) -> None:
    sim = start_sim(tpot_ms=20, output_tokens_mean=ENDLESS)
    server = sim.fleet.servers[0]
    with httpx.Client(base_url=sim.url, timeout=10) as client, ThreadPoolExecutor(1) as pool:
        long = pool.submit(generate, client, [1], 500)  # 10 s of work
        wait_until(lambda: stats(client)["num_running_reqs"] == 1, what="running")
        sim.run(server.die)
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            long.result()
        with pytest.raises(httpx.ConnectError):
            client.get("/health")
    wait_until(lambda: server.slots.running == 0, what="the cut request's slot freed")
