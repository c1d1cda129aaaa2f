"""What N workers cost one Valkey whether or not they produce rows (docs/scale.md): N workers
in a few processes, each on its own connection, holding K + 1 prompts as a GPU's worker does,
at the seed's row rate (~0.9 rows/s a GPU), with `status` and the live page polled as an
operator would and the producer's reconciliation scan every 30 s.

Real and emulated: the first `REAL` workers of each process run the worker's own code
through kombu and fleetgen's transport (`Worker`: the take by `basic_get`, `generate_one` with
the real `StreamSink` against an engine that answers at once, the ack, the heartbeat with its
renewal every 2 s, kombu's sweep, and the hand-back at the end). The others are wire workers
(bench/fleet_wire.py) on one event loop a process: the same commands and scripts on each path,
round trip for round trip (tests/bench/test_fleet_wire.py compares them, counted by Valkey),
at a fraction of kombu's and redis-py's CPU. Neither runs Celery's consumer loop or an idle
worker's BRPOP (a worker whose slots are full does not poll).

Placement (`--no-pin` to leave it to the scheduler): Valkey alone on core 0 at SCHED_FIFO, as
a deployment gives it a core of its own, the bystander on core 1 at SCHED_FIFO, everything
else on both at normal priority. Measured per N: Valkey's main-thread CPU (INFO cpu deltas), a
bystander's PING every 100 ms (its own process), commands/s by command (INFO commandstats
deltas), memory, rows/s, beats/s, lapsed leases, Valkey's slowlog and forks, and the load
average as each window opened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from bench.central import InstantEngine
from bench.common import save, table
from bench.fleet_wire import Wire, WireWorker, load_scripts
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.queue.contract import QUEUE, TaskPayload, closing_key, worker_key
from fleetgen.queue.redisconn import connect, text
from fleetgen.queue.wire import slots_in_flight, task_message, task_payload
from fleetgen.runstate.keys import RunKeys
from fleetgen.runstate.manifest import STATE_PRODUCED

RUN = "scale"
STOP_KEY = "bench:scale:stop"
READY_KEY = "bench:scale:ready"
ROWS_PER_S_A_GPU = 0.9  # the seed: ~2,700-token answers (523 M tokens / 193,010 answers)
SLOTS = 129  # K + 1 of a 128-slot server
HEALTH_S = 2.0  # FLEETGEN_HEALTH_INTERVAL_S's default
LEASE_S = 60.0  # FLEETGEN_VISIBILITY_TIMEOUT_S's default
PROMPT_TOKENS = 300
REAL = 2  # workers of each process that run kombu's and the worker's own code
LAPSED_KEY = "bench:scale:lapsed"
SETTLE_S = 10.0  # after the fill, before the window
SLOW_US = 10_000  # Valkey's slowlog threshold during the window


def payload(line: int) -> TaskPayload:
    return TaskPayload(run=RUN, line=line, id=f"r{line}", input_ids=list(range(PROMPT_TOKENS)),
                       max_tokens=4096, sampling={"temperature": 0.7}, row={"i": line})


class Worker:
    """One emulated worker: its own kombu connection, channel and QoS (fleetgen's)."""

    def __init__(self, url: str, name: str) -> None:
        from kombu import Connection

        from fleetgen.queue.broker import Transport
        from fleetgen.queue.celeryconf import celery_config
        from workers.sink import StreamSink

        options = celery_config(url, visibility_timeout_s=LEASE_S)["broker_transport_options"]
        self.conn = Connection(url, transport=Transport, transport_options=options)
        self.channel: Any = self.conn.default_channel
        self.name = name
        self.sink = StreamSink(self.channel.client, worker=name)
        self.held = 0

    def fetch(self) -> Any:
        message = self.channel.basic_get(QUEUE, no_ack=False)
        if message is not None:
            self.held += 1
        return message

    def fill(self, count: int) -> list[Any]:
        """Up to `count` fetches as `basic_get` makes them (RPOP, then `QoS.append`), in one
        round trip of RPOPs and one of appends: the fill is not measured, and 129,000 fetches
        one round trip each took minutes of these 2 cores."""
        pipe = self.channel.client.pipeline(transaction=False)
        for _ in range(count):
            pipe.rpop(QUEUE)
        messages = [self.channel.Message(orjson.loads(raw), channel=self.channel)
                    for raw in pipe.execute() if raw is not None]
        pipe = self.channel.client.pipeline(transaction=False)
        for message in messages:
            self.channel.qos.append(message, message.delivery_tag, pipe=pipe)
        pipe.execute()
        self.held += len(messages)
        return messages

    def finish(self, message: Any, engine: InstantEngine) -> None:
        from fleetgen.engine.decision import RetryPolicy
        from workers.generate import generate_one

        data = task_payload(message._raw)
        assert data is not None
        generate_one(data, engine, self.sink, RetryPolicy(), worker=self.name)  # type: ignore[arg-type]
        self.channel.basic_ack(message.delivery_tag)
        self.held -= 1

    def beat(self) -> None:
        """The gate's heartbeat (workers/gate.py `_heartbeat`): `QoS.beat`, one script."""
        from fleetgen.queue import heartbeat
        from fleetgen.queue.celeryconf import sweep_interval_s

        qos = self.channel.qos
        sweep_s = sweep_interval_s(LEASE_S)
        fields: dict[Any, Any] = {"engine": "instant://", "healthy": 1, "engine_state": "ready",
                                  "consuming": 1, "concurrency": SLOTS, "inflight": self.held,
                                  **heartbeat.lease_fields(interval_s=HEALTH_S, lease_s=LEASE_S,
                                                           sweep_s=sweep_s, held=qos.held())}
        qos.beat(worker_key(self.name), fields, heartbeat.ttl_s(HEALTH_S, LEASE_S, sweep_s),
                 closing_key())

    def sweep(self) -> None:
        self.channel.qos.restore_visible(num=self.channel.unacked_restore_limit, interval=1)


def host(url: str, first: int, count: int) -> None:
    """A process of `count` workers: the first `REAL` run kombu's and the worker's own code in
    one thread (`_real`), the others are wire workers on one event loop (bench/fleet_wire.py)."""
    real = min(REAL, count)
    workers = [Worker(url, f"w{first + i}@scale") for i in range(real)]
    thread = threading.Thread(target=_real, args=(url, workers, random.Random(first)),
                              daemon=True)
    thread.start()
    if count > real:
        asyncio.run(_emulate(url, first + real, count - real, random.Random(-first - 1),
                             workers[0] if workers else None))
    thread.join()


def _real(url: str, workers: list[Worker], rng: random.Random) -> None:
    """The real workers' events in time order: each held prompt is answered after an
    exponential time of mean SLOTS / 0.9 s (so each makes 0.9 rows/s), beats every 2 s and
    sweeps every sweep interval, staggered; at the end, the SIGTERM hand-back of what each
    holds (`QoS.restore_unacked`)."""
    from fleetgen.queue.celeryconf import sweep_interval_s

    if not workers:
        return
    engine = InstantEngine(20)
    client = connect(url)
    events: list[tuple[float, int, str, Any]] = []  # the rows' answers
    ticks: list[tuple[float, int, str, Any]] = []  # beats and sweeps
    now = time.monotonic()
    mean_s = SLOTS / ROWS_PER_S_A_GPU
    beaten = [now] * len(workers)
    for i, w in enumerate(workers):
        heapq.heappush(ticks, (now + rng.uniform(0, HEALTH_S), i, "beat", None))
        heapq.heappush(ticks, (now + rng.uniform(0, sweep_interval_s(LEASE_S)), i, "sweep",
                               None))
        while w.held < SLOTS:
            _keep_beating(workers[:i], beaten)
            taken = w.fill(SLOTS - w.held)
            if not taken:
                time.sleep(0.05)  # the producer refills the queue
            # Spread over a generation's length: the steady state from the start.
            for message in taken:
                heapq.heappush(events, (time.monotonic() + rng.uniform(0, mean_s), i, "done",
                                        message))
    client.incr(READY_KEY, len(workers))
    _loop(workers, events, ticks, engine, client, rng, mean_s)
    for w in workers:
        w.channel.qos.restore_unacked()


def _keep_beating(filled: list[Worker], beaten: list[float]) -> None:
    """The filled workers beat while the others fill: a fill of minutes on a loaded machine
    must not let their leases lapse (the others' sweeps would take their prompts back)."""
    for j, w in enumerate(filled):
        if time.monotonic() - beaten[j] >= HEALTH_S:
            w.beat()
            beaten[j] = time.monotonic()


def _loop(workers: list[Worker], rows: list[tuple[float, int, str, Any]],
          ticks: list[tuple[float, int, str, Any]], engine: InstantEngine, client: Any,
          rng: random.Random, mean_s: float) -> None:
    """Beats and sweeps (`ticks`) before any row that is due: on a machine too loaded to make
    every row in time, the rows fall behind (rows/s says by how much) and the per-worker
    traffic stays on time, as a real worker's timer thread keeps it."""
    from fleetgen.queue.celeryconf import sweep_interval_s

    next_look = 0.0
    period = {"beat": HEALTH_S, "sweep": float(sweep_interval_s(LEASE_S))}
    while True:
        now = time.monotonic()
        if now >= next_look:
            if client.exists(STOP_KEY):
                return
            next_look = now + 1.0
        heap = ticks if ticks[0][0] <= max(now, rows[0][0] if rows else now) else rows
        at, i, kind, message = heapq.heappop(heap)
        if at > now:
            time.sleep(at - now)
        w = workers[i]
        if kind in period:
            w.beat() if kind == "beat" else w.sweep()
            heapq.heappush(ticks, (at + period[kind], i, kind, None))
            continue
        if kind == "done":
            w.finish(message, engine)
        message = w.fetch()
        again = time.monotonic() + (rng.expovariate(1 / mean_s) if message else 0.2)
        heapq.heappush(rows, (again, i, "done" if message else "refill", message))


async def _emulate(url: str, first: int, count: int, rng: random.Random,
                   restorer: Worker | None) -> None:
    """`count` wire workers on this event loop, each on its own connection: filled to SLOTS
    (each beating from its fill on), then living until STOP_KEY is set."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    wires = [await Wire.open(parsed.hostname or "127.0.0.1", parsed.port or 6379)
             for _ in range(count + 1)]
    control = wires.pop()
    await load_scripts(control)
    workers = [WireWorker(f"w{first + i}@scale", wire) for i, wire in enumerate(wires)]
    stop = asyncio.Event()
    lives = []
    for w in workers:
        taken: list[bytes] = []
        while len(w.held) < SLOTS:
            got = await w.fill(SLOTS - len(w.held))
            taken += got
            if not got:
                await asyncio.sleep(0.05)  # the producer refills the queue
        lives.append(asyncio.create_task(_life(w, taken, rng, stop, _restorer(restorer,
                                                                               control))))
    await control.one("INCRBY", READY_KEY, count)
    while not await control.one("EXISTS", STOP_KEY):
        await asyncio.sleep(1.0)
    stop.set()
    for life in lives:
        life.cancel()
    await asyncio.gather(*lives, return_exceptions=True)
    for wire in (*wires, control):
        wire.close()


def _restorer(real: Worker | None, control: Wire) -> Any:
    """A sweep's restore of lapsed holders, by the real `QoS` code (a lease lapses only when
    the bench falls behind its beats: counted, the bench prints it)."""
    async def restore(holders: list[bytes], cutoff: float) -> None:
        await control.one("INCRBY", LAPSED_KEY, len(holders))
        if real is not None:
            qos = real.channel.qos
            for holder in holders:
                await asyncio.to_thread(qos._restore_holder, real.channel.client,
                                        holder.decode(), cutoff)
    return restore


async def _life(w: WireWorker, taken: list[bytes], rng: random.Random, stop: asyncio.Event,
                restore: Any) -> None:
    """One wire worker's events in time order, as `_real` orders a real worker's: beats and
    sweeps first (a real worker's timer thread keeps them on time), then each row due. A
    timer that fell behind fires once, late, as Celery's timer does, not once a missed
    period."""
    from fleetgen.queue.celeryconf import sweep_interval_s

    loop = asyncio.get_running_loop()
    engine = InstantEngine(20)
    mean_s, sweep_s = SLOTS / ROWS_PER_S_A_GPU, float(sweep_interval_s(LEASE_S))
    now = loop.time()
    # Each held prompt's answer due after an exponential wait: an exponential's residual life
    # is the same exponential, so the rate is SLOTS / mean_s from the first second. (Uniform
    # waits over [0, mean_s] overlapped the first answers with the next prompts' answers and
    # ran ~20 % over the target in the window: 1,105 rows/s for 900.)
    rows = [(now + rng.expovariate(1 / mean_s), tag) for tag in taken]
    heapq.heapify(rows)
    next_beat, next_sweep = now, now + rng.uniform(0, sweep_s)
    fields = {"engine": "instant://", "healthy": 1, "engine_state": "ready", "consuming": 1,
              "concurrency": SLOTS}
    while not stop.is_set():
        at = min(next_beat, next_sweep, rows[0][0] if rows else now + 0.2)
        if at > loop.time():
            await asyncio.sleep(at - loop.time())
        now = loop.time()
        if next_beat <= now:
            await w.beat(fields, HEALTH_S, LEASE_S, sweep_s)
            next_beat = max(next_beat + HEALTH_S, now)
        elif next_sweep <= now:
            await w.sweep(LEASE_S, restore)
            next_sweep = max(next_sweep + sweep_s, now)
        elif rows and rows[0][0] <= now:
            _, tag = heapq.heappop(rows)
            if tag is not None and tag in w.held:
                await w.answer(tag, payload(w.held[tag]), engine)  # type: ignore[arg-type]
            got = await w.take()
            heapq.heappush(rows, (now + rng.expovariate(1 / mean_s), got) if got else
                           (now + 0.2, None))


def pinger(url: str, out: Path) -> None:
    """The bystander: a PING every 100 ms on its own connection, each latency in ms."""
    client = connect(url)
    latencies: list[float] = []
    while not client.exists(STOP_KEY):
        started = time.perf_counter()
        client.ping()
        latencies.append(1000 * (time.perf_counter() - started))
        time.sleep(max(0.0, 0.1 - (time.perf_counter() - started)))
    out.write_bytes(orjson.dumps(latencies))


class Producer(threading.Thread):
    """Keeps the shared queue at `depth` messages (LPUSH in batches, as the producer does)."""

    def __init__(self, url: str, depth: int) -> None:
        super().__init__(daemon=True)
        self.client = connect(url)
        self.depth, self.line, self.stop = depth, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            missing = self.depth - int(self.client.llen(QUEUE))
            for start in range(0, max(missing, 0), 500):
                pipe = self.client.pipeline(transaction=False)
                batch = [task_message(payload(self.line + j + 1))
                         for j in range(min(500, missing - start))]
                self.line += len(batch)
                pipe.lpush(QUEUE, *batch).execute()


class Operator(threading.Thread):
    """The live page's sample every 2 s, `status` every 10 s, the producer's reconciliation
    scan every 30 s, and a stand-in drainer trimming the stream; each call's time kept."""

    def __init__(self, url: str) -> None:
        from fleetgen.monitor.live import Sampler

        super().__init__(daemon=True)
        self.client = connect(url)
        self.sampler = Sampler(self.client, RUN)
        self.stop = threading.Event()
        self.seconds: dict[str, list[float]] = {"live page": [], "status": [],
                                                "slots_in_flight": []}

    def run(self) -> None:
        from fleetgen.monitor.status import gather, render

        started = time.monotonic()
        jobs = [("live page", 2.0, self.sampler.sample),
                ("status", 10.0, lambda: render(gather(self.client, RUN))),  # type: ignore[arg-type]
                ("slots_in_flight", 30.0, lambda: slots_in_flight(self.client, RUN))]
        due = {name: started for name, _, _ in jobs}
        while not self.stop.wait(0.5):
            self.client.xtrim(RunKeys(RUN).stream, maxlen=1000, approximate=True)
            for name, every_s, job in jobs:
                if time.monotonic() >= due[name]:
                    t = time.perf_counter()
                    job()
                    self.seconds[name].append(time.perf_counter() - t)
                    due[name] = time.monotonic() + every_s


def _main_thread_cpu_s(client: Any) -> float:
    cpu = client.info("cpu")
    if "used_cpu_sys_main_thread" in cpu:
        return float(cpu["used_cpu_sys_main_thread"]) + float(cpu["used_cpu_user_main_thread"])
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _commands(client: Any) -> dict[str, tuple[int, int]]:
    """Each command's calls and the microseconds Valkey spent in them (a script's own
    commands are counted both under EVALSHA and under their own names)."""
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for k, v in client.info("commandstats").items()}


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.Popen([sys.executable, "-m", "bench.fleet_scale", *args], env=env)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


VALKEY_CORE, BENCH_CORE = 0, 1  # with --pin: Valkey's core, and everything else's
VALKEY_NICE = -20


def placement() -> str:
    """What `--pin` does, for the table's header: Valkey alone and first on one core, as a
    deployment gives it a host or a core of its own, and the bystander first on the other; the
    emulated workers and the operator at normal priority on both, taking what those two
    leave (pinned to the bystander's core, they lost it to the other engineers' work that
    Valkey's core turned away: 175 rows/s of 900 at N = 1,000, load 10)."""
    if len(os.sched_getaffinity(0)) < 2:
        return "unpinned (one core)"
    return (f"Valkey pinned to core {VALKEY_CORE} (SCHED_FIFO), the bystander to core "
            f"{BENCH_CORE} (SCHED_FIFO), emulated workers and operator on both at normal "
            "priority")


def _pin_valkey(pid: int) -> None:
    """Every thread of Valkey (its main thread and its background ones) on its core, first in
    line for it (`_raise_priority`): the other engineers' work on this machine runs on both
    cores, and at nice 0 it preempted Valkey mid-command (an RPOP of 15 ms in the slowlog)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), {VALKEY_CORE})
        _raise_priority(int(task.name))


def _raise_priority(tid: int) -> None:
    """SCHED_FIFO (root only; the kernel keeps 5 % of each core for the others whatever it
    does), else the highest nice this process may set, else as it is. Reset on fork: Valkey's
    AOF-rewrite child inherited SCHED_FIFO on Valkey's core and took it from the main thread
    until it blocked (bystander PINGs of 261 ms at N = 300, p99 12.4 ms at N = 1,000); at
    normal priority it runs when the main thread waits, as on a host where the rewrite has
    a core of its own. The fork itself (~20 ms at 390 MiB) is the main thread's and counts."""
    try:
        os.sched_setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
        return
    except (PermissionError, OSError):
        pass
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, tid, VALKEY_NICE)


def run(n: int, processes: int, window_s: float, work: Path, pin: bool) -> dict[str, Any]:
    valkey = EmbeddedValkey(work / f"valkey{n}").start()
    if pin:
        assert valkey.proc is not None
        _pin_valkey(valkey.proc.pid)
    hosts: list[subprocess.Popen[bytes]] = []
    try:
        client = connect(valkey.url)
        client.hset(RunKeys(RUN).manifest, mapping={"state": STATE_PRODUCED, "total": 10**9,
                                                    "started_at": time.time()})
        producer = Producer(valkey.url, depth=5000)
        producer.start()
        share = -(-n // processes)
        hosts = [_spawn("host", "--redis", valkey.url, "--first", str(first),
                        "--count", str(min(share, n - first)))
                 for first in range(0, n, share)]
        fill_started = time.monotonic()
        while int(client.get(READY_KEY) or 0) < n:
            if any(h.poll() is not None for h in hosts):
                raise RuntimeError("an emulated worker process exited during the fill")
            time.sleep(0.5)
        fill_s = time.monotonic() - fill_started
        producer.depth = max(200, int(2 * n * ROWS_PER_S_A_GPU))  # ~2 s of rows queued
        try:
            return {**_measure(client, valkey.url, n, window_s, work, pin),
                    "fill_s": fill_s}
        finally:
            producer.stop.set()
    finally:
        client.set(STOP_KEY, 1)
        for h in hosts:
            try:
                h.wait(timeout=120)
            except subprocess.TimeoutExpired:
                h.kill()
        valkey.stop()


def _measure(client: Any, url: str, n: int, window_s: float, work: Path, pin: bool,
             ) -> dict[str, Any]:
    pings = work / f"pings{n}.json"
    operator = Operator(url)
    time.sleep(SETTLE_S)  # the fill's late rows answered before the window opens
    client.config_resetstat()
    client.config_set("slowlog-log-slower-than", SLOW_US)
    client.slowlog_reset()
    forks0 = int(client.info("stats")["total_forks"])
    load = _load()
    cpu0, done0 = _main_thread_cpu_s(client), int(client.hget(RunKeys(RUN).stats, "done") or 0)
    lapsed0 = int(client.get(LAPSED_KEY) or 0)
    started = time.monotonic()
    bystander = _spawn("ping", "--redis", url, "--out", str(pings))
    if pin:  # it measures Valkey, not its own wait for a core
        os.sched_setaffinity(bystander.pid, {BENCH_CORE})
        _raise_priority(bystander.pid)
    operator.start()
    memory: list[int] = []
    while time.monotonic() - started < window_s:
        time.sleep(2.0)
        memory.append(int(client.info("memory")["used_memory"]))
    seconds = time.monotonic() - started
    cpu = _main_thread_cpu_s(client) - cpu0
    done = int(client.hget(RunKeys(RUN).stats, "done") or 0) - done0
    commands = _commands(client)
    lapsed = int(client.get(LAPSED_KEY) or 0) - lapsed0
    stats = client.info("stats")
    slow = [(text(e["command"]).split(" ")[0], e["duration"] / 1000)
            for e in client.slowlog_get(20)]
    unacked = int(client.memory_usage("unacked", samples=5) or 0)
    in_flight = int(client.hlen("unacked"))
    operator.stop.set()
    operator.join()
    client.set(STOP_KEY, 1)
    bystander.wait(timeout=30)
    latencies = orjson.loads(pings.read_bytes())
    return {"workers": n, "seconds": seconds, "in_flight": in_flight, "load_average": load,
            "rows_per_s": done / seconds, "rows_per_s_target": n * ROWS_PER_S_A_GPU,
            # A beat's EXPIRE of its heartbeat hash; a lapsed lease is a beat that came late.
            "beats_per_s": commands.get("expire", (0, 0))[0] / seconds, "lapsed": lapsed,
            # Valkey's stalls: commands slower than SLOW_US, and its forks (the AOF rewrite's).
            "slow_commands_ms": slow, "forks": int(stats["total_forks"]) - forks0,
            "latest_fork_ms": int(stats["latest_fork_usec"]) / 1000,
            "valkey_main_thread_busy": cpu / seconds,
            "ping_ms": {"p50": _percentile(latencies, 0.5), "p99": _percentile(latencies, 0.99),
                        "max": max(latencies, default=0.0), "count": len(latencies)},
            "valkey_ms_per_s": {k: usec / 1000 / seconds
                                for k, (_, usec) in sorted(commands.items())},
            "commands_per_s": {k: calls / seconds for k, (calls, _) in sorted(commands.items())
                               if calls / seconds >= 0.1},
            "valkey_memory_bytes": {"peak": max(memory or [0]), "unacked_hash": unacked},
            "operator_call_s": {k: max(v, default=0.0) for k, v in operator.seconds.items()}}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _print(results: list[dict[str, Any]], placement: str) -> None:
    print(table("fleet at scale: N emulated workers, K + 1 = 129 held each, 0.9 rows/s a GPU; "
                f"{placement}; load average (1, 5, 15 min) at each N's start: "
                + ", ".join(f"N={r['workers']} {r['load_average']}" for r in results),
                ["N", "in flight", "rows/s", "target", "beats/s", "target", "lapsed",
                 "Valkey main thread", "PING p50 ms",
                 "p99 ms", "max ms", "Valkey MiB", "slots_in_flight s"],
                [[r["workers"], r["in_flight"], r["rows_per_s"], r["rows_per_s_target"],
                  r["beats_per_s"], r["workers"] / HEALTH_S, r["lapsed"],
                  f"{100 * r['valkey_main_thread_busy']:.1f} %", r["ping_ms"]["p50"],
                  r["ping_ms"]["p99"], r["ping_ms"]["max"],
                  r["valkey_memory_bytes"]["peak"] / (1 << 20),
                  r["operator_call_s"]["slots_in_flight"]] for r in results]))
    for r in results:
        top = sorted(r["commands_per_s"].items(), key=lambda kv: -kv[1])[:10]
        print(f"N={r['workers']} commands/s:", ", ".join(f"{k} {v:,.0f}" for k, v in top))
        costly = sorted(r["valkey_ms_per_s"].items(), key=lambda kv: -kv[1])[:10]
        print(f"N={r['workers']} Valkey ms a second by command:",
              ", ".join(f"{k} {v:.1f}" for k, v in costly))
        print(f"N={r['workers']} forks {r['forks']} (last {r['latest_fork_ms']:.1f} ms), "
              f"commands over {SLOW_US / 1000:.0f} ms:",
              ", ".join(f"{name} {ms:.1f}" for name, ms in r["slow_commands_ms"]) or "none")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fleet_scale", description=__doc__)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "host", "ping"])
    parser.add_argument("--workers", default="100,300,1000", help="the Ns, comma-separated")
    parser.add_argument("--window-s", type=float, default=20.0, help="measured seconds per N")
    parser.add_argument("--processes", type=int, default=4, help="emulated workers' processes")
    parser.add_argument("--redis", help="host/ping mode: the Valkey URL")
    parser.add_argument("--first", type=int, default=0, help="host mode: first worker number")
    parser.add_argument("--count", type=int, default=1, help="host mode: workers")
    parser.add_argument("--out", type=Path, help="ping mode: where the latencies go")
    parser.add_argument("--figure", default="fleet-scale", help="the figures' file name")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="leave Valkey and the emulated workers to the scheduler")
    args = parser.parse_args(argv)
    if args.mode == "host":
        host(args.redis, args.first, args.count)
        return 0
    if args.mode == "ping":
        pinger(args.redis, args.out)
        return 0
    ns = [int(n) for n in args.workers.split(",")]
    pin = args.pin and len(os.sched_getaffinity(0)) > BENCH_CORE
    where = placement() if pin else "unpinned"
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        results = []
        for n in ns:
            print(f"N={n}: load average {_load()} on {os.cpu_count()} cores", flush=True)
            results.append(run(n, args.processes, args.window_s, Path(tmp), pin))
    _print(results, where)
    save(args.figure, {"results": results, "slots": SLOTS, "placement": where,
                       "rows_per_s_a_gpu": ROWS_PER_S_A_GPU},
         {"workers": args.workers, "window_s": args.window_s, "processes": args.processes,
          "pin": args.pin})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
