"""A slow Valkey never holds Celery's consumer loop through an ack (issue 52, queue/acks.py).

With the threads pool, Celery runs every ack and reject of a task on the consumer loop
(`Consumer.call_soon_ack` -> `hub.call_soon`); the Redis part of each used to wait there for
Valkey. Here Valkey holds writes for 12 s (`CLIENT PAUSE 12000 WRITE`: reads answer, every
write waits), and the worker's engine is SIGKILLed at the same moment while the worker holds
four prompts on it: each task hands its prompt back (`Reject(requeue=True)`), a write that
waits for the pause. Once all four have, the engine is started again. The loop's own work must go on
meanwhile: the health gate closes on the dead engine and opens on the new one, and the loop's
timer says Valkey is lost (the beat, a write, waits too), each within the pause; the
hand-backs land after it, and the run completes with every row once. Before the acks thread,
the first hand-back held the loop for the rest of the pause: the gate opened only after it.

The second test takes a message into the pause: the worker is blocked on the empty queue when
the message arrives, and Valkey answers the take just before it holds writes. The record of
that take (`QoS.append`, on the loop before Celery sees the message) waited there for the
pause; now it waits on the acks thread, and the gate closes and reopens meanwhile without
declaring its queues again (the reopening's LLEN pipeline, seen by MONITOR, is gone).

The third has kombu's sweep of expired binding tables (the remote-control channel's, once a
minute; every half second here) fall due inside the pause: it waits on the sweep's thread,
no longer on the loop's timer.

The fourth has an operator's `celery inspect ping` answered into the pause: the command is
published just before Valkey holds writes, so the worker's reply (an LPUSH to the caller's
reply queue, kombu's `Node.reply`) waits for the pause; it waits on a thread of its own
(workers/control.py), no longer on the loop, and reaches the caller after the pause.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.transport import redis as kombu_redis

from fleetgen.local.ports import lease_port
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.queue.celeryconf import make_app
from fleetgen.queue.contract import QUEUE
from fleetgen.queue.wire import held_key, taking_key
from fleetgen.simulator.config import SimConfig
from fleetgen.simulator.server import run_in_thread
from tests.support.cli import fleetgen, fleetgen_cli
from tests.support.pipeline import assert_exactly_once, drain_until_complete, make_prompts
from tests.support.waiting import wait_until
from tests.support.workers import heartbeat_key, start_worker, stop

pytestmark = pytest.mark.fleet

PAUSE_S = 12.0
SLOTS = 4
ROWS = 8
# What the loop does during the pause, as the worker's log says it (workers/gate.py,
# workers/beat.py), and what shows the hand-backs were given (workers/celery.py).
GATE_CLOSED = re.compile(r"engine \S+ gone .* stops taking prompts")
GATE_OPEN = re.compile(r"engine \S+ ready again")
VALKEY_LOST = re.compile(r"Valkey lost: no heartbeat has reached it")
HANDED_BACK = re.compile(r"engine gone \(.*\); prompt handed back")


@pytest.fixture()
def valkey(tmp_path: Path) -> Iterator[EmbeddedValkey]:
    """A Valkey of this test's own: a paused server pauses every client of it."""
    server = EmbeddedValkey(tmp_path / "valkey").start()
    yield server
    server.stop()


def _sim(port: int, log: Path, ttft_ms: int) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(fleetgen_cli(
            "sim", "--port", str(port), "--context-length", "4096", "--max-running-requests",
            "8", "--ttft-ms", str(ttft_ms), "--tpot-ms", "1", "--output-tokens-mean", "20"),
            stdout=out, stderr=subprocess.STDOUT)
    return proc


def _since(log: Path, since: int) -> str:
    return log.read_bytes()[since:].decode(errors="replace")


def _seen(log: Path, since: int, patterns: dict[str, re.Pattern[str]],
          seen: dict[str, float]) -> None:
    """When each pattern first appears in the log after byte `since` (monotonic seconds)."""
    text = _since(log, since)
    for name, pattern in patterns.items():
        if name not in seen and pattern.search(text):
            seen[name] = time.monotonic()


def _gate_through_the_pause(sim: subprocess.Popen[bytes], port: int,
                            worker: subprocess.Popen[bytes], worker_log: Path, since: int,
                            paused_at: float, patterns: dict[str, re.Pattern[str]],
                            close_within_s: float, settle_s: float = 0.0) -> tuple[
                                dict[str, float], Any]:
    """Inside the write pause: SIGKILL the engine, wait up to `close_within_s` for the gate to
    close, `settle_s` more, start the engine again and watch the worker's log for `patterns`
    until the pause nearly ends. When each was seen (monotonic), and the engine's handle."""
    sim.send_signal(signal.SIGKILL)
    sim.wait(timeout=10)
    seen: dict[str, float] = {}

    def closed() -> bool:
        _seen(worker_log, since, {"gate closed": GATE_CLOSED}, seen)
        return "gate closed" in seen

    wait_until(closed, close_within_s,
               f"the gate to close within {close_within_s:g} s of the engine's kill",
               check=lambda: _alive(worker, worker_log))
    time.sleep(settle_s)
    back = run_in_thread(SimConfig(port=port, ttft_ms=50, tpot_ms=1, health_delay_s=0.0,
                                   context_length=4096, output_tokens_mean=20))
    end = paused_at + PAUSE_S - 0.5
    while time.monotonic() < end and not set(patterns) <= set(seen):
        _seen(worker_log, since, patterns, seen)
        time.sleep(0.05)
    return seen, back


def test_the_loop_keeps_working_while_acks_wait_on_a_slow_valkey(
        valkey: EmbeddedValkey, tmp_path: Path) -> None:
    client = redis.Redis.from_url(valkey.url)
    lease = lease_port()
    port = lease.port
    sim_log, worker_log = tmp_path / "sim.log", tmp_path / "worker.log"
    sim = _sim(port, sim_log, ttft_ms=600_000)  # the prompts are held, never answered
    worker = start_worker(valkey.url, f"http://127.0.0.1:{port}", "acks", worker_log,
                          concurrency=SLOTS, env={"FLEETGEN_ENGINE_GONE_S": "1"})
    try:
        prompts = make_prompts(tmp_path / "prompts.jsonl", ROWS, seed=52)
        fleetgen("produce", str(tmp_path / "prompts.jsonl"), "--run", "acks", "--redis",
                 valkey.url, "--context-length", "4096", "--max-output-tokens", "32",
                 "--no-wait")
        key = heartbeat_key("acks")
        wait_until(lambda: client.hget(key, "held") == str(SLOTS).encode(), 90,
                   "the worker to hold its slots", check=lambda: _alive(worker, worker_log))
        assert _holders(client) == SLOTS
        since = worker_log.stat().st_size

        client.execute_command("CLIENT", "PAUSE", int(PAUSE_S * 1000), "WRITE")
        paused_at = time.monotonic()
        sim.send_signal(signal.SIGKILL)
        sim.wait(timeout=10)
        seen: dict[str, float] = {}
        patterns = {"gate closed": GATE_CLOSED, "Valkey lost": VALKEY_LOST,
                    "gate open": GATE_OPEN}
        # Every task hands back before the engine returns (a task that saw it back would
        # generate again instead): in-process, so it answers at once.
        wait_until(lambda: len(HANDED_BACK.findall(_since(worker_log, since))) == SLOTS,
                   PAUSE_S - 4, "the worker's tasks to hand their prompts back")
        seen["handed back"] = time.monotonic()
        back = run_in_thread(SimConfig(port=port, ttft_ms=50, tpot_ms=1, health_delay_s=0.0,
                                       context_length=4096, output_tokens_mean=20))
        end = paused_at + PAUSE_S - 0.5
        while time.monotonic() < end and not set(patterns) <= set(seen):
            _seen(worker_log, since, patterns, seen)
            time.sleep(0.05)
        # The fault landed: the hand-backs wait on the pause (nothing went back to the queue,
        # the holder still holds all four in Valkey) while the loop does its work.
        still_held = _holders(client)
        queued = client.llen(QUEUE)
        assert time.monotonic() < paused_at + PAUSE_S, "the checks ran past the pause"
        text = _since(worker_log, since)
        at = {name: round(t - paused_at, 1) for name, t in seen.items()}
        print(f"\n[acks off the loop] seen during the {PAUSE_S:g} s write pause: {at}; "
              f"held in Valkey {still_held}, queued {queued}")
        assert still_held == SLOTS and queued == ROWS - SLOTS, \
            f"a hand-back reached Valkey inside the pause: held {still_held}, queued {queued}"
        assert len(HANDED_BACK.findall(text)) == SLOTS, text[-3000:]
        missing = sorted(set(patterns) - set(seen))
        assert not missing, f"the loop did not get to {missing} within the pause\n{text[-3000:]}"

        out = tmp_path / "out"
        drainer = drain_until_complete(valkey.url, "acks", out, timeout_s=90)
        assert drainer.write_summary()["complete"], worker_log.read_text()[-3000:]
        assert_exactly_once(out, set(prompts["good"]))
        back.stop()
    finally:
        stop(worker)
        if sim.poll() is None:
            sim.kill()
            sim.wait(timeout=10)
        lease.close()


def test_a_take_and_the_gates_reopening_never_hold_the_loop_on_a_slow_valkey(
        valkey: EmbeddedValkey, tmp_path: Path) -> None:
    client = redis.Redis.from_url(valkey.url)
    lease = lease_port()
    port = lease.port
    sim_log, worker_log = tmp_path / "sim.log", tmp_path / "worker.log"
    sim = _sim(port, sim_log, ttft_ms=600_000)
    prompts = make_prompts(tmp_path / "prompts.jsonl", 3, seed=53)
    fleetgen("produce", str(tmp_path / "prompts.jsonl"), "--run", "take", "--redis",
             valkey.url, "--context-length", "4096", "--max-output-tokens", "32", "--no-wait")
    # One message waits outside the queue: it arrives while the worker blocks on the empty
    # queue, just before the pause.
    client.lmove(QUEUE, "staged", "LEFT", "LEFT")
    worker = start_worker(valkey.url, f"http://127.0.0.1:{port}", "take", worker_log,
                          concurrency=SLOTS, env={"FLEETGEN_ENGINE_GONE_S": "1"})
    monitor = _Monitor(valkey.url)
    try:
        wait_until(lambda: _holders(client) == 2, 90, "the worker to hold the first two",
                   check=lambda: _alive(worker, worker_log))
        (held,) = [k.decode() for k in client.scan_iter(held_key("*"))]
        taking = taking_key(held.rsplit(":", 1)[1])
        time.sleep(1.5)  # two takes found the queue empty: the worker blocks on it
        since = worker_log.stat().st_size
        monitor.start()
        # One pipeline: Valkey serves the blocked take as soon as the message is in the queue,
        # then holds every write; the take's record is a write, sent after the reply.
        pipe = client.pipeline(transaction=False)
        pipe.lmove("staged", QUEUE, "RIGHT", "RIGHT")
        pipe.execute_command("CLIENT", "PAUSE", int(PAUSE_S * 1000), "WRITE")
        pipe.execute()
        paused_at = time.monotonic()
        time.sleep(0.5)
        # The fault landed: the message was taken (in the taking list) and its record waits.
        assert not client.exists(QUEUE) and client.llen(taking) == 1 \
            and _holders(client) == 2, "the take did not land just before the pause"
        patterns = {"gate closed": GATE_CLOSED, "Valkey lost": VALKEY_LOST,
                    "gate open": GATE_OPEN, "consuming again": CONSUMING_OWN}
        # settle_s: the tasks find the engine gone and hand back (on the acks thread).
        seen, back = _gate_through_the_pause(sim, port, worker, worker_log, since, paused_at,
                                             patterns, close_within_s=4, settle_s=1.0)
        recorded_in_pause = client.llen(taking) == 0
        sent = monitor.stop()
        assert time.monotonic() < paused_at + PAUSE_S, "the checks ran past the pause"
        text = _since(worker_log, since)
        at = {name: round(t - paused_at, 1) for name, t in seen.items()}
        declares = [cmd for cmd in sent if DECLARE.match(cmd)]
        print(f"\n[take off the loop] seen during the {PAUSE_S:g} s write pause: {at}; "
              f"declarations sent {declares}")
        assert not recorded_in_pause, "the take's record reached Valkey inside the pause"
        missing = sorted(set(patterns) - set(seen))
        assert not missing, f"the loop did not get to {missing} within the pause\n{text[-3000:]}"
        assert not declares, f"the gate's reopening declared its queues again: {declares}"

        wait_until(lambda: client.llen(taking) == 0, 30, "the record to land after the pause")
        out = tmp_path / "out"
        drainer = drain_until_complete(valkey.url, "take", out, timeout_s=90)
        assert drainer.write_summary()["complete"], worker_log.read_text()[-3000:]
        assert_exactly_once(out, set(prompts["good"]))
        back.stop()
    finally:
        monitor.stop()
        stop(worker)
        if sim.poll() is None:
            sim.kill()
            sim.wait(timeout=10)
        lease.close()


# kombu's `Queue.declare` on a Redis channel: the message count's LLEN pipeline, the binding's
# SADDs (`Channel._size`, `Channel._queue_bind`).
DECLARE = re.compile(r"(LLEN fleetgen(?!:)|SADD _kombu\.binding)")
CONSUMING_OWN = re.compile(r"Started consuming from fleetgen\.to\.")


class _Monitor:
    """Valkey's MONITOR on a thread: every command any client sends while it runs (MONITOR is
    not a write: a write pause does not hold it)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client = redis.Redis.from_url(url)
        self._sent: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            with self._client.monitor() as m:
                ready.set()
                for cmd in m.listen():
                    if self._stop.is_set():
                        return
                    self._sent.append(str(cmd["command"]))

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(5)

    def stop(self) -> list[str]:
        if self._thread is not None and not self._stop.is_set():
            self._stop.set()
            redis.Redis.from_url(self._url).ping()  # a command for `listen` to return
            self._thread.join(5)
        return list(self._sent)


def _holders(client: redis.Redis) -> int:
    """How many tags the workers' holder sets hold in Valkey (a read: answered in a pause)."""
    return sum(int(client.scard(k)) for k in client.scan_iter(held_key("*")))


def _alive(proc: subprocess.Popen[bytes], log: Path) -> None:
    assert proc.poll() is None, log.read_text()[-3000:]


# The worker's `sitecustomize` (test_binding_sweep_never_holds_the_loop): kombu's sweep of
# expired binding tables falls due every half second instead of every minute
# (`BINDING_SWEEP_INTERVAL`, read at each call), and each one says in the log on which thread it
# ran, when it was sent and when Valkey answered it (wall clock, as the test's).
BINDING_HOOK = '''\
import sys, threading, time
from kombu.transport import redis as kombu_redis

kombu_redis.BINDING_SWEEP_INTERVAL = 0.5
_sweep = kombu_redis.Channel.sweep_bindings


def sweep_bindings(self, limit=100):
    sent = time.time()
    try:
        return _sweep(self, limit)
    finally:
        print(f"binding sweep on {threading.current_thread().name}: sent {sent:.3f} "
              f"answered {time.time():.3f}", file=sys.stderr, flush=True)


kombu_redis.Channel.sweep_bindings = sweep_bindings
'''
BINDING_SWEEP = re.compile(r"binding sweep on (\S+): sent ([\d.]+) answered ([\d.]+)")


def test_the_binding_sweep_never_holds_the_loop_on_a_slow_valkey(
        valkey: EmbeddedValkey, tmp_path: Path) -> None:
    """kombu's timer for the remote-control channel (`maybe_refresh_binding_expiry`, every
    second: its pidbox queue expires) runs `sweep_bindings`, a write script, once a minute;
    here every half second, so one falls due inside the write pause, before the engine is
    killed. The loop must go on meanwhile: the gate closes on the kill and opens on the
    engine's return, and `Valkey lost` is said, within the pause. On the loop's timer the
    sweep held it for the rest of the pause."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(BINDING_HOOK)
    client = redis.Redis.from_url(valkey.url)
    lease = lease_port()
    port = lease.port
    worker_log = tmp_path / "worker.log"
    sim = _sim(port, tmp_path / "sim.log", ttft_ms=50)
    worker = start_worker(valkey.url, f"http://127.0.0.1:{port}", "bindings", worker_log,
                          concurrency=SLOTS,
                          env={"FLEETGEN_ENGINE_GONE_S": "1", "PYTHONPATH": str(hook)})
    back = None
    try:
        wait_until(lambda: client.exists(heartbeat_key("bindings")) == 1
                   and len(BINDING_SWEEP.findall(worker_log.read_text())) >= 2, 90,
                   "the worker's heartbeat and its binding sweeps",
                   check=lambda: _alive(worker, worker_log))
        since = worker_log.stat().st_size
        client.execute_command("CLIENT", "PAUSE", int(PAUSE_S * 1000), "WRITE")
        paused_at, paused_wall = time.monotonic(), time.time()
        time.sleep(1.5)  # the timer runs every second: a sweep has fallen due and waits
        killed_at = time.monotonic()
        patterns = {"gate closed": GATE_CLOSED, "Valkey lost": VALKEY_LOST,
                    "gate open": GATE_OPEN}
        seen, back = _gate_through_the_pause(sim, port, worker, worker_log, since, paused_at,
                                             patterns, close_within_s=3)
        assert time.monotonic() < paused_at + PAUSE_S, "the checks ran past the pause"
        at = {name: round(t - paused_at, 1) for name, t in seen.items()}
        # The fault landed: a binding sweep was sent inside the pause and Valkey answered it
        # only once the pause was over.
        wait_until(lambda: any(float(s) - paused_wall < PAUSE_S - 1
                               and float(a) - paused_wall > PAUSE_S - 1
                               for _, s, a in BINDING_SWEEP.findall(_since(worker_log, since))),
                   PAUSE_S + 10 - (time.monotonic() - paused_at),
                   "a binding sweep sent in the pause to be answered after it")
        held = [(thread, round(float(s) - paused_wall, 1), round(float(a) - paused_wall, 1))
                for thread, s, a in BINDING_SWEEP.findall(_since(worker_log, since))
                if float(a) - float(s) > 1]
        print(f"\n[binding sweep off the loop] seen during the {PAUSE_S:g} s write pause: {at} "
              f"(engine killed at {killed_at - paused_at:.1f} s); binding sweeps that waited "
              f"on it (thread, sent, answered): {held}")
        text = _since(worker_log, since)
        missing = sorted(set(patterns) - set(seen))
        assert not missing, f"the loop did not get to {missing} within the pause\n{text[-3000:]}"
    finally:
        stop(worker)
        if back is not None:
            back.stop()
        if sim.poll() is None:
            sim.kill()
            sim.wait(timeout=10)
        lease.close()


# The worker's `sitecustomize` (test_a_remote_control_reply_never_holds_the_loop): each reply to
# a remote-control command says in the log on which thread it was published, when it was sent
# and when Valkey took it (wall clock, as the test's).
REPLY_HOOK = '''\
import sys, threading, time
from kombu import pidbox

_publish = pidbox.Mailbox._publish_reply


def _publish_reply(self, *args, **kwargs):
    sent = time.time()
    try:
        return _publish(self, *args, **kwargs)
    finally:
        print(f"control reply on {threading.current_thread().name}: sent {sent:.3f} "
              f"answered {time.time():.3f}", file=sys.stderr, flush=True)


pidbox.Mailbox._publish_reply = _publish_reply
'''
CONTROL_REPLY = re.compile(r"control reply on (\S+): sent ([\d.]+) answered ([\d.]+)")


class _Batch:
    """kombu's publish batch (`_put_fanout(..., _publish_batch=...)`) as a redis-py pipeline."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    def add(self, command: str, *args: Any) -> None:
        getattr(self.pipe, command)(*args)


def test_a_remote_control_reply_never_holds_the_loop_on_a_slow_valkey(
        valkey: EmbeddedValkey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`celery inspect ping` from the test's own Celery app: its command's PUBLISH and the
    write pause go to Valkey in one pipeline, so the worker gets the command and its reply
    waits for the pause. The engine is killed 1 s into the pause: the gate must close within
    3 s of the kill, and open again, and `Valkey lost` be said, within the pause; the reply
    reaches the caller after it. With the reply on the loop it held the loop to the end."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(REPLY_HOOK)
    client = redis.Redis.from_url(valkey.url)
    lease = lease_port()
    port = lease.port
    worker_log = tmp_path / "worker.log"
    sim = _sim(port, tmp_path / "sim.log", ttft_ms=50)
    worker = start_worker(valkey.url, f"http://127.0.0.1:{port}", "control", worker_log,
                          concurrency=SLOTS,
                          env={"FLEETGEN_ENGINE_GONE_S": "1", "PYTHONPATH": str(hook)})
    name = f"control@{socket.gethostname()}"
    app = make_app(valkey.url, visibility_timeout_s=7200)
    app.conf.control_queue_expires = 60.0  # the caller's reply queue outlives the pause
    back = None
    times: dict[str, float] = {}
    replies: list[Any] = []
    try:
        wait_until(lambda: client.exists(heartbeat_key("control")) == 1, 90,
                   "the worker's heartbeat", check=lambda: _alive(worker, worker_log))
        # Once outside the pause: the worker answers (and its producer pool has a channel).
        assert app.control.ping(destination=[name], timeout=10) == [{name: {"ok": "pong"}}]
        # The worker writes a reply's line once its publish returns, which can be after the
        # caller took the reply: this one's line is waited for, or it reads as the next one's.
        wait_until(lambda: CONTROL_REPLY.search(worker_log.read_text()) is not None, 15,
                   "the worker's line for its first reply")
        since = worker_log.stat().st_size
        put_fanout = kombu_redis.Channel._put_fanout

        def publish_then_pause(self: Any, exchange: Any, message: Any, routing_key: Any,
                               **kwargs: Any) -> None:
            kwargs.pop("_publish_batch", None)
            with self.conn_or_acquire() as conn:
                pipe = conn.pipeline(transaction=False)
                put_fanout(self, exchange, message, routing_key, _publish_batch=_Batch(pipe),
                           **kwargs)
                pipe.execute_command("CLIENT", "PAUSE", int(PAUSE_S * 1000), "WRITE")
                pipe.execute()
            times["paused"], times["paused wall"] = time.monotonic(), time.time()

        monkeypatch.setattr(kombu_redis.Channel, "_put_fanout", publish_then_pause)

        def ping() -> None:
            replies.extend(app.control.ping(destination=[name], timeout=PAUSE_S + 15))
            times["answered"] = time.monotonic()

        pinger = threading.Thread(target=ping, daemon=True)
        pinger.start()
        wait_until(lambda: "paused" in times, 10, "the command and the pause")
        paused_at, paused_wall = times["paused"], times["paused wall"]
        time.sleep(1.0)  # the worker has the command: its reply waits on the pause
        killed_at = time.monotonic()
        patterns = {"gate closed": GATE_CLOSED, "Valkey lost": VALKEY_LOST,
                    "gate open": GATE_OPEN}
        seen, back = _gate_through_the_pause(sim, port, worker, worker_log, since, paused_at,
                                             patterns, close_within_s=3)
        assert time.monotonic() < paused_at + PAUSE_S, "the checks ran past the pause"
        at = {what: round(t - paused_at, 1) for what, t in seen.items()}
        text = _since(worker_log, since)
        missing = sorted(set(patterns) - set(seen))
        assert not missing, f"the loop did not get to {missing} within the pause\n{text[-3000:]}"
        # The fault landed: the reply was sent inside the pause and taken only after it, and
        # the caller got it then.
        pinger.join(PAUSE_S + 20)
        wait_until(lambda: CONTROL_REPLY.search(_since(worker_log, since)) is not None, 15,
                   "the worker's line for its reply")
        published = [(thread, round(float(s) - paused_wall, 1), round(float(a) - paused_wall, 1))
                     for thread, s, a in CONTROL_REPLY.findall(_since(worker_log, since))]
        print(f"\n[control reply off the loop] seen during the {PAUSE_S:g} s write pause: {at} "
              f"(engine killed at {killed_at - paused_at:.1f} s); replies published (thread, "
              f"sent, answered): {published}; the caller answered at "
              f"{times.get('answered', float('nan')) - paused_at:.1f} s: {replies}")
        assert replies == [{name: {"ok": "pong"}}], text[-3000:]
        assert times["answered"] - paused_at > PAUSE_S - 1
        assert [p for p in published if p[1] < PAUSE_S - 1 < p[2]], published
        assert {thread for thread, _, _ in published} == {"fleetgen-replies"}, published
    finally:
        app.close()
        stop(worker)
        if back is not None:
            back.stop()
        if sim.poll() is None:
            sim.kill()
            sim.wait(timeout=10)
        lease.close()
