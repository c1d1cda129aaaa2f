"""The engines fleetgen starts itself (`--engine-cmd`): one per GPU group, each in a process
group of its own with CUDA_VISIBLE_DEVICES and a log, watched on a thread of its own (its
process exiting, its readiness probe failing for a set time, its requests all timing out
while the probe passes), killed whole and started again with backoff, parked after too many
failures, and stopped whole at the end."""

from __future__ import annotations

import enum
import functools
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetgen.engine.health import Prober
from fleetgen.engine.http import server_client
from fleetgen.local.enginecmd import EngineCommand, EnginePolicy, FailureWindow, backoff_s
from fleetgen.local.ports import PortLease, lease_port
from fleetgen.local.procs import dying_with_parent
from fleetgen.local.silence import WorkerSilence, stuck_for_s
from fleetgen.runstate.keys import run_keys

LOG_TAIL_LINES = 5
POLL_S = 0.25  # how often a starting engine's process and probe are looked at
# How long a SIGKILLed engine's group may take to be gone before the next start goes ahead
# anyway (said in its log): a process frees its memory and its CUDA context on its way out,
# which takes seconds for a large GPU process, and the new engine wants its port and GPU.
KILLED_GONE_S = 30.0


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    RESTARTING = "restarting"  # failed, waiting out its backoff
    FAILED = "failed"  # never became ready: its first start failed, not retried
    PARKED = "parked"  # failed too often within the window: left stopped
    STOPPED = "stopped"


# Phases an engine never leaves: nothing more to wait for at the start.
SETTLED = frozenset({Phase.FAILED, Phase.PARKED, Phase.STOPPED})


@dataclass(frozen=True)
class EngineView:
    """One engine as the progress line, `status` and the tests see it."""

    name: str
    gpus: tuple[str, ...]
    url: str
    phase: Phase
    restarts: int
    pid: int | None
    ready_after_s: float | None  # of its last start
    error: str | None  # why it last failed

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "gpus": ",".join(self.gpus), "url": self.url,
                "phase": self.phase.value, "restarts": self.restarts, "error": self.error}

    def describe(self) -> str:
        if self.phase is Phase.READY and self.ready_after_s is not None:
            state = f"ready after {self.ready_after_s:.0f} s"
        else:
            state = self.phase.value
        more = f", {self.restarts} restart(s)" if self.restarts else ""
        return f"{self.name} {state}{more}"


def signal_group(pgid: int, signum: int) -> bool:
    """Signal a whole process group; False once no process of it is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # a group id reused by another user's process: not ours
        return False
    return True


def group_alive(pgid: int) -> list[int]:
    """The processes of group `pgid` that still run: zombies are left out, since a dead child
    whose parent died first waits for PID 1 to reap it (which a container's PID 1 may never
    do) and holds no port or GPU memory. Without /proc: whether a signal still reaches any."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pgid] if signal_group(pgid, 0) else []
    alive = []
    for entry in entries:
        if entry.isdigit() and _running_in(int(entry), pgid):
            alive.append(int(entry))
    return alive


def _running_in(pid: int, pgid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone meanwhile
        return False
    # `pid (comm) state ppid pgrp ...`: comm may hold spaces and parentheses; split after it.
    fields = stat[stat.rfind(")") + 2:].split()
    return len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X")


def wait_group_gone(pgid: int, timeout_s: float,
                    reap: Callable[[], object] = lambda: None) -> bool:
    """Until no process of the group runs (True) or `timeout_s` has passed (False); `reap`
    collects the leader meanwhile, so its zombie does not count."""
    deadline = time.monotonic() + timeout_s
    while True:
        reap()
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)  # a bounded wait on a condition


def stop_group(proc: subprocess.Popen[bytes], grace_s: float,
               gone_s: float = KILLED_GONE_S) -> bool:
    """SIGTERM to the process and every child it made (its group), SIGKILL after `grace_s` to
    what is left, and a wait (at most `gone_s`) until every one of them has exited, the leader
    reaped: a SIGKILLed process still frees its memory and GPU context before it is gone, and
    a child may outlive a leader that died first. False if one is still there."""
    pgid = proc.pid
    signal_group(pgid, signal.SIGTERM)
    if not wait_group_gone(pgid, grace_s, proc.poll):
        signal_group(pgid, signal.SIGKILL)
    gone = wait_group_gone(pgid, gone_s, proc.poll)
    proc.wait()
    return gone


class SupervisedEngine:
    """One engine's life on its own thread: start, wait ready, watch, restart or give up."""

    def __init__(self, name: str, gpus: tuple[str, ...], port: int, command: EngineCommand,
                 policy: EnginePolicy, log_path: Path) -> None:
        self.name, self.gpus, self.port = name, gpus, port
        self.url = f"http://127.0.0.1:{port}"
        self.command, self.policy, self.log_path = command, policy, log_path
        self.env: dict[str, str] = {}
        self.say: Callable[[str], None] = lambda text: None
        # The `silent_s` of each live worker on this engine (fleetgen/local/silence.py); none
        # known, no silence.
        self.silences: Callable[[], list[float]] = list
        self.phase = Phase.LOADING
        self.restarts = 0
        self.ever_ready = False
        self.ready_after_s: float | None = None
        self.error: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._failures = FailureWindow(policy)
        self._grace_s = policy.stop_grace_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fleetgen-{name}", daemon=True)

    def view(self) -> EngineView:
        proc = self.proc
        return EngineView(self.name, self.gpus, self.url, self.phase, self.restarts,
                          proc.pid if proc is not None and proc.poll() is None else None,
                          self.ready_after_s, self.error)

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace_s: float | None = None) -> None:
        """Ask the engine's thread to stop it: SIGTERM, SIGKILL after `grace_s` (default: the
        policy's)."""
        if grace_s is not None:
            self._grace_s = grace_s
        self._stop.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:] if line.strip())

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._launch()
                except OSError as exc:  # the program gone, not executable, out of pids
                    if not self._after_failure(f"could not be started ({exc})"):
                        return
                    continue
                reason = self._await_ready()
                if reason is None:
                    reason = self._watch()
                if self._stop.is_set():
                    break
                self._kill()
                if not self._after_failure(reason):
                    return
        finally:
            self._kill()
            if self.phase not in (Phase.FAILED, Phase.PARKED):
                self.phase = Phase.STOPPED

    def _launch(self) -> None:
        self.phase = Phase.LOADING
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"--- fleetgen: starting {self.name} (start {self.restarts + 1}) on "
                      f"GPU {','.join(self.gpus)}, port {self.port}\n".encode())
            log.flush()
            # Its thread lives as long as the engine: the engine dies with fleetgen.
            self.proc = subprocess.Popen(
                dying_with_parent(self.command.argv(self.port, self.gpus)), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, **self.env, **self.command.environment(self.port, self.gpus),
                     "CUDA_VISIBLE_DEVICES": ",".join(self.gpus)})
        self._started_at = time.monotonic()

    def _await_ready(self) -> str | None:
        """None once ready; else why it is not (the stop event set counts as a reason)."""
        assert self.proc is not None
        with server_client(self.url) as http:
            probe = Prober(http, self.policy.probe_timeout_s)
            while not self._stop.wait(POLL_S):
                code = self.proc.poll()
                if code is not None:
                    return f"exited with code {code} while starting"
                if probe().ready:
                    self.ready_after_s = time.monotonic() - self._started_at
                    self.phase, self.ever_ready = Phase.READY, True
                    self.say(f"{self.name} ({self.url}) ready after "
                             f"{self.ready_after_s:.0f} s")
                    return None
                if time.monotonic() - self._started_at > self.policy.start_timeout_s:
                    return (f"not ready after {self.policy.start_timeout_s:g} s "
                            "(--engine-start-timeout-s)")
        return "stopped"

    def _watch(self) -> str:
        """Until the process exits, the probe fails for `unhealthy_after_s`, or the probe
        passes while the requests all time out for `silent_after_s`: the reason."""
        assert self.proc is not None
        failing_since: float | None = None
        ready_at = time.monotonic()
        with server_client(self.url) as http:
            probe = Prober(http, self.policy.probe_timeout_s)
            while not self._stop.wait(self.policy.probe_interval_s):
                code = self.proc.poll()
                if code is not None:
                    return f"exited with code {code}"
                found = probe()
                now = time.monotonic()
                if found.ready:
                    failing_since = None
                    stuck_s = stuck_for_s(self.silences(), now - ready_at)
                    if stuck_s >= self.policy.silent_after_s:
                        return (f"answered no request for {stuck_s:.0f} s while they timed "
                                "out and its health check passed")
                    continue
                failing_since = failing_since or now
                if now - failing_since >= self.policy.unhealthy_after_s:
                    return (f"failed its health check for {now - failing_since:.0f} s "
                            f"({found.detail})")
        return "stopped"

    def _after_failure(self, reason: str) -> bool:
        """Record a failure; True to start again (after the backoff), False to give up."""
        self.error = reason
        if not self.ever_ready:
            self.phase = Phase.FAILED
            self.say(f"{self.name} failed to start: {reason}; last lines of {self.log_path}: "
                     f"{self.log_tail() or '(empty)'}")
            return False
        count = self._failures.record(time.monotonic())
        if self._failures.parked():
            self.phase = Phase.PARKED
            self.say(f"{self.name} ({self.url}) {reason}; parked after {count} failures "
                     f"within {self.policy.window_s:g} s, the run goes on without it (log: "
                     f"{self.log_path})")
            return False
        self.phase = Phase.RESTARTING
        delay = backoff_s(count, self.policy)
        self.say(f"{self.name} ({self.url}) {reason}; restarting in {delay:g} s (log: "
                 f"{self.log_path})")
        if self._stop.wait(delay):
            return False
        self.restarts += 1
        return True

    def _kill(self) -> None:
        """The engine's whole group gone before anything else happens: a restart must not
        find its port or GPU still held by the last one's processes."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            gone = stop_group(proc, self._grace_s)
        else:  # the leader died: its children too, and they may take a while to go
            signal_group(proc.pid, signal.SIGKILL)
            gone = wait_group_gone(proc.pid, KILLED_GONE_S)
        if not gone:
            self.say(f"{self.name}: processes {group_alive(proc.pid)} of its group still run "
                     f"{KILLED_GONE_S:g} s after SIGKILL; going on without waiting for them")


class EngineSet:
    """Every engine of this node: ports leased for the set's life (a restart gets the same
    URL, which its worker is pinned to), started at once, stopped at once."""

    def __init__(self, command: EngineCommand, groups: Sequence[tuple[str, ...]],
                 policy: EnginePolicy, log_dir: Path) -> None:
        self.policy = policy
        self._leases: list[PortLease] = [lease_port() for _ in groups]
        self._say: Callable[[str], None] = print
        self.engines = [
            SupervisedEngine(f"engine{i}", gpus, lease.port, command, policy,
                             log_dir / f"engine{i}.log")
            for i, (gpus, lease) in enumerate(zip(groups, self._leases, strict=True))]

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    def start(self, say: Callable[[str], None], env: dict[str, str] | None = None,
              silence: WorkerSilence | None = None) -> None:
        """`silence`: the workers' heartbeats, for the rule on an engine that stops answering
        while its probe passes (none: that rule is off)."""
        self._say = say
        for i, engine in enumerate(self.engines):
            engine.say, engine.env = say, dict(env or {})
            if silence is not None:
                engine.silences = functools.partial(silence.silences, i)
            engine.start()

    def views(self) -> list[EngineView]:
        return [e.view() for e in self.engines]

    def ready_as_they_come(self, report_every_s: float = 30.0) -> Iterator[int]:
        """Until every engine is ready or has failed to start: the index of each as it becomes
        ready (its worker can start at once, while slower ones load), and every
        `report_every_s` meanwhile a line on where each one is."""
        seen: set[int] = set()
        due = time.monotonic() + report_every_s
        while True:
            views = self.views()
            for i, engine in enumerate(self.engines):
                if i not in seen and engine.ever_ready:
                    seen.add(i)
                    yield i
            if all(e.ever_ready or v.phase in SETTLED
                   for e, v in zip(self.engines, views, strict=True)):
                return
            if time.monotonic() >= due:
                due = time.monotonic() + report_every_s
                self._say("engines: " + "; ".join(v.describe() for v in views))
            time.sleep(POLL_S)  # the poll period of the engines' own threads

    def note(self) -> str:
        """For the progress line: restarts and parked engines, empty when there are none."""
        views = self.views()
        restarts = sum(v.restarts for v in views)
        parked = [v.name for v in views if v.phase is Phase.PARKED]
        parts = ([f"{restarts} restart(s)"] if restarts else []) + (
            [f"parked {','.join(parked)}"] if parked else [])
        return ", ".join(parts)

    def begin_stop(self, grace_s: float | None = None) -> None:
        """Every engine's group at once: SIGTERM, SIGKILL after `grace_s` (default: the
        policy's), each by its own thread; `stop` waits for them."""
        for engine in self.engines:
            engine.stop(grace_s)

    def stop(self, grace_s: float | None = None) -> None:
        self.begin_stop(grace_s)
        for engine in self.engines:
            engine.join((self.policy.stop_grace_s if grace_s is None else grace_s) + 5)
        for lease in self._leases:
            lease.close()
        self._leases = []


def publish(client: Any, run: str, views: Sequence[EngineView], host: str | None = None) -> None:
    """This node's engines as `fleetgen status` shows them (RunKeys.engines), one field each."""
    where = host or socket.gethostname()
    if views:
        client.hset(run_keys(run).engines, mapping={
            f"{where}/{v.name}": json.dumps(v.to_json()) for v in views})
