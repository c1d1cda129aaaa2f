"""The engine supervisor on real processes, `fleetgen sim` as the launched engine: a killed
engine is back on its URL (the restart time measured), a hung one (SIGSTOP) is killed and
started again, one that keeps dying (`--die-after-s`) is parked, one that exits while starting
is named with its log, and a stop leaves no process of any engine's group behind."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fleetgen.engine.health import probe_url
from fleetgen.local.enginecmd import EngineCommand, EnginePolicy, parse_engine_cmd
from fleetgen.local.engines import EngineSet, Phase, group_alive, stop_group, wait_group_gone
from fleetgen.local.silence import WorkerSilence
from tests.support.survivors import marked, new_mark
from tests.support.waiting import wait_until

pytestmark = pytest.mark.fleet

SIM = f"{shlex.quote(sys.executable)} -m fleetgen.simulator --port {{port}} --ttft-ms 0"
# Quick enough for a test: probed every 0.2 s, unhealthy after 1.5 s, 1 s to stop.
QUICK = EnginePolicy(start_timeout_s=60, unhealthy_after_s=1.5, probe_interval_s=0.2,
                     probe_timeout_s=0.5, stop_grace_s=1.0, backoff_base_s=0.5)


class Said(list[str]):
    def __call__(self, text: str) -> None:
        self.append(text)


@pytest.fixture()
def mark() -> dict[str, str]:
    return new_mark()


def engines_of(tmp_path: Path, cmd: str, policy: EnginePolicy = QUICK,
               gpus: int = 1) -> EngineSet:
    return EngineSet(parse_engine_cmd(cmd), [(str(g),) for g in range(gpus)], policy,
                     tmp_path / "engines")


@pytest.fixture()
def started(tmp_path: Path, mark: dict[str, str]) -> Iterator[tuple[EngineSet, Said]]:
    # A child of its own beside the server (SGLang's scheduler and detokenizer are such
    # children): it must go with the engine's group, at a restart and at the stop.
    engines = engines_of(tmp_path, f"bash -c 'sleep 300 & exec {SIM} --seed 1'", gpus=2)
    said = Said()
    engines.start(said, env=mark)
    try:
        yield engines, said
    finally:
        engines.stop()


def ready(engines: EngineSet) -> bool:
    return all(v.phase is Phase.READY for v in engines.views())


def test_a_killed_engine_is_back_on_its_url_and_a_stop_leaves_nothing(
        started: tuple[EngineSet, Said], mark: dict[str, str]) -> None:
    engines, said = started
    assert sorted(engines.ready_as_they_come()) == [0, 1]
    assert len(marked(mark)) == 4  # two servers, two sleeps
    first = engines.views()[1]
    assert first.pid is not None and probe_url(first.url).ready
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "1"
    environ = Path(f"/proc/{first.pid}/environ").read_bytes().split(b"\0")
    assert b"CUDA_VISIBLE_DEVICES=1" in environ
    killed_at = time.monotonic()
    os.kill(first.pid, signal.SIGKILL)
    wait_until(lambda: engines.views()[1].restarts == 1 and ready(engines), 60,
               "the killed engine serving again")
    restart_s = time.monotonic() - killed_at
    again = engines.views()[1]
    assert again.url == first.url and again.pid != first.pid and probe_url(again.url).ready
    assert any(f"engine1 ({first.url}) exited with code -9; restarting in 0.5 s" in s
               for s in said), said
    assert len(marked(mark)) == 4, marked(mark)  # the dead one's sleep went with it
    assert engines.note() == "1 restart(s)"
    print(f"\nsimulator restart, SIGKILL to serving again: {restart_s:.1f} s")
    engines.stop()
    assert marked(mark) == []
    assert {v.phase for v in engines.views()} == {Phase.STOPPED}


def test_a_hung_engine_is_killed_and_started_again(started: tuple[EngineSet, Said]) -> None:
    engines, said = started
    list(engines.ready_as_they_come())
    hung = engines.views()[0]
    assert hung.pid is not None
    os.kill(hung.pid, signal.SIGSTOP)
    wait_until(lambda: engines.views()[0].restarts == 1 and ready(engines), 60,
               "the hung engine replaced")
    assert any("engine0" in s and "failed its health check for" in s for s in said), said


class Told(WorkerSilence):
    """What engine0's two workers say of its silence, as the test sets it: each silent since
    a time, or hearing answers (None)."""

    def __init__(self) -> None:
        self.since: list[float | None] = [None, None]

    def silences(self, engine: int) -> list[float]:
        now = time.monotonic()
        return [0.0 if t is None else now - t for t in self.since] if engine == 0 else []


def test_an_engine_whose_workers_all_hear_nothing_is_restarted(
        tmp_path: Path, mark: dict[str, str]) -> None:
    engines = engines_of(tmp_path, SIM, replace(QUICK, silent_after_s=2.0))
    told, said = Told(), Said()
    engines.start(said, env=mark, silence=told)
    try:
        assert list(engines.ready_as_they_come()) == [0]
        # One worker's requests time out, the other's are answered: busy, not stuck.
        told.since[0] = time.monotonic()
        watched_until = time.monotonic() + 3 * 2.0
        while time.monotonic() < watched_until:
            assert engines.views()[0].restarts == 0, said
            time.sleep(0.1)  # watching that nothing happens for a bounded time
        told.since[1] = time.monotonic()
        wait_until(lambda: engines.views()[0].restarts == 1, 30, "the silent engine restarted")
        told.since = [None, None]  # the new engine answers
        wait_until(lambda: ready(engines), 30, "the engine serving again")
        (line,) = [s for s in said if "restarting" in s]
        assert "engine0" in line and "answered no request for 2 s while they timed out and " \
            "its health check passed; restarting in 0.5 s" in line, said
    finally:
        engines.stop()
    assert marked(mark) == []


def test_a_dead_leaders_children_are_gone_before_the_next_start(
        tmp_path: Path, mark: dict[str, str]) -> None:
    # The leader SIGKILLed alone (the OOM killer, a test): its children live on in its group
    # and get SIGKILL from the supervisor, and a SIGKILLed process takes a while to be gone
    # (a GPU server frees its memory and its CUDA context): the next start waits for them.
    # Here 20 busy children on 2 cores, most waiting for a core to run their exit on: without
    # the wait, some are still there when the SIGKILL is sent.
    engine = engines_of(tmp_path, SIM).engines[0]
    children = "for i in $(seq 20); do (while :; do :; done) & done; wait"
    engine.proc = subprocess.Popen(["bash", "-c", children], start_new_session=True,
                                   env={**os.environ, **mark})
    pgid = engine.proc.pid
    wait_until(lambda: len(group_alive(pgid)) == 21, 30, "the children started")
    os.kill(pgid, signal.SIGKILL)
    engine.proc.wait()
    assert len(group_alive(pgid)) == 20
    engine._kill()
    assert group_alive(pgid) == [] and marked(mark) == []


def test_a_stop_waits_for_the_whole_group_and_says_when_it_cannot(tmp_path: Path) -> None:
    proc = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 300 & wait"],
                            start_new_session=True)
    wait_until(lambda: len(group_alive(proc.pid)) == 2, 30, "the child started")
    assert stop_group(proc, grace_s=0.2) and group_alive(proc.pid) == []
    # A process still there at the bound is reported (False), for the supervisor to say.
    stuck = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert not wait_group_gone(stuck.pid, 0.2)
    finally:
        stop_group(stuck, grace_s=0.2)
    assert group_alive(stuck.pid) == []


def test_an_engine_that_keeps_dying_is_parked(tmp_path: Path, mark: dict[str, str]) -> None:
    policy = EnginePolicy(start_timeout_s=60, unhealthy_after_s=0.3, probe_interval_s=0.1,
                          probe_timeout_s=0.5, stop_grace_s=1.0, backoff_base_s=0.2,
                          max_failures=2)
    engines = engines_of(tmp_path, f"{SIM} --die-after-s 1.5", policy)
    said = Said()
    engines.start(said, env=mark)
    try:
        wait_until(lambda: engines.views()[0].phase is Phase.PARKED, 60, "the engine parked")
        (line,) = [s for s in said if "parked" in s]
        assert "parked after 2 failures within 600 s, the run goes on without it" in line
        assert engines.note() == "1 restart(s), parked engine0"
        assert engines.views()[0].pid is None and marked(mark) == []
    finally:
        engines.stop()


def test_an_engine_that_exits_while_starting_is_named_with_its_log(
        tmp_path: Path, mark: dict[str, str]) -> None:
    cmd = (f"{shlex.quote(sys.executable)} -c \"import sys; print('loading'); "
           f"print('CUDA error: out of memory'); sys.exit(3)\" {{port}}")
    engines = engines_of(tmp_path, cmd, gpus=2)
    said = Said()
    engines.start(said, env=mark)
    try:
        assert list(engines.ready_as_they_come()) == []
        assert {v.phase for v in engines.views()} == {Phase.FAILED}
        line = next(s for s in said if s.startswith("engine0"))
        assert "engine0 failed to start: exited with code 3 while starting" in line
        assert "loading | CUDA error: out of memory" in line
        assert str(tmp_path / "engines" / "engine0.log") in line
    finally:
        engines.stop()
    assert marked(mark) == []


KILLED_PARENT = """
import sys, time
from pathlib import Path
from fleetgen.local.enginecmd import EngineCommand, EnginePolicy, parse_engine_cmd
from fleetgen.local.engines import EngineSet
engines = EngineSet(parse_engine_cmd(sys.argv[1]), [("0",), ("1",)], EnginePolicy(),
                    Path(sys.argv[2]))
engines.start(print)
list(engines.ready_as_they_come())
print("settled", flush=True)
time.sleep(600)
"""


def test_engines_die_with_a_sigkilled_fleetgen(tmp_path: Path, mark: dict[str, str]) -> None:
    # Slurm's SIGKILL after KillWait, the OOM killer: nothing runs fleetgen's stop, and the
    # engines are in sessions of their own; they get SIGTERM from the kernel instead.
    parent = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, SIM, str(tmp_path)],
                              env={**os.environ, **mark}, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert "settled" in parent.stdout.readline() + parent.stdout.readline() + \
            parent.stdout.readline(), "the engines never settled"
        assert len(marked(mark)) == 3  # the parent and two simulators
        parent.kill()
        parent.wait(timeout=10)
        wait_until(lambda: not marked(mark), 20, "the engines gone with their parent")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_an_engine_that_cannot_be_started_at_all_fails_and_is_settled(tmp_path: Path) -> None:
    # The program checked at the start and gone since (an environment removed mid-run).
    engines = EngineSet(EngineCommand(("/no/such/server", "--port", "{port}")), [("0",)],
                        QUICK, tmp_path / "engines")
    said = Said()
    engines.start(said)
    try:
        assert list(engines.ready_as_they_come()) == []
        assert engines.views()[0].phase is Phase.FAILED
        # Said by Popen (could not be started) or, through setpriv, by the log (exit 127).
        assert said[0].startswith("engine0 failed to start: ") and "/no/such/server" in said[0]
    finally:
        engines.stop()


def test_a_launch_lines_variables_reach_the_engine_and_the_group_wins(tmp_path: Path) -> None:
    # `NAME=value prog ...` as a shell line (SGLang on CPU needs SGLANG_USE_CPU_ENGINE=1):
    # the engine sees the variables, {gpu} filled in, and its own GPU group whatever the
    # line says of CUDA_VISIBLE_DEVICES.
    seen = tmp_path / "env.txt"
    script = ("import os, sys; open(sys.argv[1], 'w').write(os.environ['FLEETGEN_T'] + ' ' "
              "+ os.environ['CUDA_VISIBLE_DEVICES']); os.execv(sys.executable, [sys.executable]"
              " + sys.argv[2:])")
    cmd = (f"FLEETGEN_T=gpu{{gpu}} CUDA_VISIBLE_DEVICES=7 {shlex.quote(sys.executable)} -c "
           f"{shlex.quote(script)} {seen} -m fleetgen.simulator --port {{port}} --ttft-ms 0")
    engines = engines_of(tmp_path, cmd)
    engines.start(Said())
    try:
        wait_until(lambda: ready(engines), 30)
    finally:
        engines.stop()
    assert seen.read_text() == "gpu0 0"
