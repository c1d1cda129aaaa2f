"""What `fleetgen run` says of its engines, from heartbeats written as workers write them into a
real Valkey (fleetgen/cli/runview.py FleetView): a fall and a return said once each, a worker
whose beats stop said with when its prompts are back, a joined host's engine counted."""

from __future__ import annotations

import time

import pytest
import redis

from fleetgen.cli.runview import LOOK_EVERY_S, FleetView
from fleetgen.queue.contract import worker_key
from fleetgen.queue.serverclock import server_time
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_PRODUCING

RUN = "view"
A, B = "http://127.0.0.1:31000", "http://127.0.0.1:31001"


def beat(client: redis.Redis, name: str, engine: str, *, healthy: bool, at: float,
         inflight: int = 0) -> None:
    client.hset(worker_key(name), mapping={
        "engine": engine, "healthy": int(healthy), "consuming": int(healthy), "at": at,
        "interval_s": 2.0, "lease_s": 60.0, "sweep_s": 5.0, "held": inflight,
        "inflight": inflight, "concurrency": 9})


def test_falls_and_returns_are_said_once(rclient: redis.Redis) -> None:
    rclient.hset(RunKeys(RUN).manifest, mapping={"state": STATE_PRODUCING, "expected": 10})
    said: list[str] = []
    now = [time.time()]
    view = FleetView(rclient, RUN, [A, B + "/"], said.append, clock=lambda: now[0])

    def look(step_s: float = LOOK_EVERY_S) -> None:
        now[0] += step_s
        view.look()

    beat(rclient, "gpu0@h", A, healthy=True, at=now[0], inflight=7)
    beat(rclient, "gpu1@h", B, healthy=True, at=now[0], inflight=3)
    look()
    assert said == [] and view.engines_up == (2, 2)
    beat(rclient, "gpu0@h", A, healthy=False, at=now[0])
    look()
    beat(rclient, "gpu1@h", B, healthy=True, at=now[0], inflight=3)
    look()  # said once, not at every look
    assert len(said) == 1 and view.engines_up == (1, 2)
    assert said[0].startswith(f"engine {A} stopped answering at ")
    assert "(worker gpu0@h: ENGINE DOWN): the 7 prompt(s) it was answering go back to the " \
           "queue for the other engines" in said[0]
    beat(rclient, "gpu0@h", A, healthy=True, at=now[0])
    beat(rclient, "gpu1@h", B, healthy=True, at=now[0], inflight=3)
    look()
    assert said[1].startswith(f"engine {A} answers again at ") and "(down 0m04s)" in said[1]
    assert view.engines_up == (2, 2)

    # gpu1's process dies: its beats stop (its hash stays until its prompts are back).
    beat(rclient, "gpu0@h", A, healthy=True, at=now[0] + 10)
    look(10)
    assert len(said) == 3 and view.engines_up == (1, 2)
    assert said[2].startswith(f"worker gpu1@h of engine {B} LOST at ")
    assert "(no heartbeat: stopped, or cut off from Valkey): the 3 prompt(s) it was answering " \
           "go back to the queue within" in said[2]

    # Its link heals (issue 52): it beats again, and its return is said as a worker's.
    beat(rclient, "gpu1@h", B, healthy=True, at=now[0] + 2)
    beat(rclient, "gpu0@h", A, healthy=True, at=now[0] + 2)
    look()
    assert len(said) == 4 and said[3].startswith(f"worker gpu1@h of engine {B} back at ")
    assert "(lost 0m02s): it takes prompts again" in said[3]
    beat(rclient, "gpu1@h", B, healthy=True, at=now[0] + 10)
    beat(rclient, "gpu0@h", A, healthy=True, at=now[0] + 10)
    look(10)
    assert len(said) == 4

    # A worker that joined from another host brings its engine into the count.
    beat(rclient, "gpu0@other", "http://10.0.0.9:30000", healthy=True, at=now[0] + 2)
    beat(rclient, "gpu0@h", A, healthy=True, at=now[0] + 2)
    look()
    assert view.engines_up == (3, 3) and len(said) == 4


def test_heartbeats_are_read_on_valkeys_clock(rclient: redis.Redis,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's host's clock 120 s ahead of its Redis (a --redis on another host): a worker
    that beat a moment ago on Valkey's clock, as workers write their beats, is up, not lost."""
    rclient.hset(RunKeys(RUN).manifest, mapping={"state": STATE_PRODUCING, "expected": 10})
    beat(rclient, "gpu0@h", A, healthy=True, at=server_time(rclient), inflight=2)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 120.0)
    said: list[str] = []
    view = FleetView(rclient, RUN, [A], said.append)  # the default clock, as `run` builds it
    view.look()
    assert said == [] and view.engines_up == (1, 1) and view.in_flight is not None


def test_a_resume_says_nothing_of_the_stopped_runs_workers(rclient: redis.Redis) -> None:
    """Every resume printed three false `worker … stopped (no heartbeat)` lines: the stopped
    run's heartbeats linger, lost, until this run's workers beat. An engine is said gone only
    once this run has seen it answer."""
    rclient.hset(RunKeys(RUN).manifest, mapping={"state": STATE_PRODUCING, "expected": 10})
    said: list[str] = []
    now = [time.time()]
    view = FleetView(rclient, RUN, [A], said.append, clock=lambda: now[0])
    beat(rclient, "gpu0@h", A, healthy=True, at=now[0] - 300, inflight=4)  # last run's, lost
    now[0] += LOOK_EVERY_S
    view.look()
    assert said == [] and view.engines_up == (0, 1)
    beat(rclient, "gpu0@h", A, healthy=True, at=now[0])  # this run's worker beats
    now[0] += LOOK_EVERY_S
    view.look()
    assert said == [] and view.engines_up == (1, 1)
    beat(rclient, "gpu0@h", A, healthy=False, at=now[0])  # then it falls: said
    now[0] += LOOK_EVERY_S
    view.look()
    assert len(said) == 1 and said[0].startswith(f"engine {A} stopped answering")


def limit_beat(client: redis.Redis, name: str, engine: str, at: float, *, inflight: int,
               limit: int, source: str, running: int, waiting: int, paced: int = 1,
               limit_max: int = 2048) -> None:
    beat(client, name, engine, healthy=True, at=at, inflight=inflight)
    client.hset(worker_key(name), mapping={
        "concurrency": limit, "limit_from": source, "paced": paced, "limit_max": limit_max,
        "engine_running": running, "engine_waiting": waiting})


def test_the_limit_and_its_source_are_said_once_settled(rclient: redis.Redis) -> None:
    """The run's terminal names each engine's limit and where it comes from once it settles
    (not at every step of the pacer's climb), and says when a limit holds an engine back."""
    rclient.hset(RunKeys(RUN).manifest, mapping={"state": STATE_PRODUCING, "expected": 10})
    said: list[str] = []
    now = [time.time()]
    view = FleetView(rclient, RUN, [A, B], said.append, clock=lambda: now[0])
    source = "vllm reports no slot count: found from its queue (vllm:num_requests_waiting)"
    for limit, inflight, running, waiting in ((16, 16, 16, 0), (64, 60, 60, 0),
                                              (132, 132, 128, 4), (134, 133, 128, 5)):
        now[0] += LOOK_EVERY_S
        limit_beat(rclient, "gpu0@h", A, now[0], inflight=inflight, limit=limit,
                   source=source, running=running, waiting=waiting)
        limit_beat(rclient, "gpu1@h", B, now[0], inflight=8, limit=8, source="-c 8, as given",
                   running=8, waiting=0, paced=0, limit_max=8)
        view.look()
    mine = [line for line in said if line.startswith(f"engine {A}")]
    assert mine == [f"engine {A}: 133 in flight, limit 134; its queue: 128 running, 5 waiting "
                    f"({source})"]
    held = [line for line in said if line.startswith(f"engine {B}") and "HOLDS" in line]
    assert len(held) == 1 and "raise it (-c)" in held[0] and "8 running, 0 waiting" in held[0]


def test_with_every_worker_cut_off_nothing_says_the_next_sweep(rclient: redis.Redis) -> None:
    """Issue 52, point 4: with every worker cut off from Valkey none can sweep, so neither the
    run's terminal nor `status` says the prompts are back "at the next sweep"."""
    from fleetgen.monitor import status

    rclient.hset(RunKeys(RUN).manifest, mapping={"state": STATE_PRODUCING, "expected": 10})
    said: list[str] = []
    now = [time.time()]
    view = FleetView(rclient, RUN, [A, B], said.append, clock=lambda: now[0])
    beat(rclient, "gpu0@h", A, healthy=True, at=now[0], inflight=2)
    beat(rclient, "gpu1@h", B, healthy=True, at=now[0], inflight=3)
    now[0] += LOOK_EVERY_S
    view.look()
    now[0] += 120  # both cut off for two minutes: past the 60 s lease
    view.look()
    assert len(said) == 2, said
    for line in said:
        assert "LOST at" in line and "next sweep" not in line
        assert "only once a worker reaches Valkey again" in line
    s = status.RunStatus(RUN, STATE_PRODUCING, 10, 10, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 1.0, 0.0,
                         0.0, None, lost_held=5, lost_back_in_s=0.0,
                         workers=[status.WorkerStatus("gpu0@h", lost=True, health="LOST"),
                                  status.WorkerStatus("gpu1@h", lost=True, health="LOST")])
    assert "next sweep" not in status.lost_line(s)
    assert "only once a worker reaches Valkey again" in status.lost_line(s)
    s.workers[0] = status.WorkerStatus("gpu0@h", health="ok")
    assert "back in the queue at the next sweep" in status.lost_line(s)
