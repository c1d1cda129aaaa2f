"""A run's state from Redis alone: counts, rates, ETA, per-worker figures (no output files)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import redis

from fleetgen.queue import wire
from fleetgen.queue.celeryconf import sweep_interval_s
from fleetgen.queue.contract import worker_key
from fleetgen.queue.heartbeat import DEFAULT_INTERVAL_S, LOST_AFTER_BEATS, Heartbeat
from fleetgen.queue.redisconn import read_hash, text
from fleetgen.queue.serverclock import server_time
from fleetgen.queue.wire import unrenewed_leases
from fleetgen.runstate.keys import run_keys
from fleetgen.runstate.lifecycle import run_complete
from fleetgen.runstate.manifest import (
    STATE_COMPLETE,
    STATE_PRODUCED,
    STATE_PRODUCING,
    STATE_STOPPED,
    RunManifest,
)
from fleetgen.settings.envvars import VISIBILITY_TIMEOUT_S


@dataclass
class WorkerStatus:
    name: str
    done: int = 0
    failed: int = 0
    completion_tokens: int = 0
    healthy: bool | None = None  # None: no heartbeat (stopped, or its prompts back long ago)
    consuming: bool | None = None
    engine: str | None = None
    in_flight: int | None = None  # from the heartbeat, so up to one health interval old
    concurrency: int | None = None  # the in-flight limit in force (workers/pacing.py)
    limit_from: str | None = None  # where that limit comes from, one line
    limit_note: str | None = None  # the pacer's last decision from the engine's token rate
    limit_max: int | None = None  # its ceiling (the pool): a paced limit grows up to it
    paced: bool | None = None
    engine_running: int | None = None  # the engine's own queue, where its /metrics say
    engine_waiting: int | None = None
    engine_slots: int | None = None  # the running requests it reports, where it does
    # Its heartbeat lapsed (fleetgen/queue/heartbeat.py): dead or frozen. `held` prompts are
    # its until its leases lapse, back in the queue within `back_in_s`.
    lost: bool = False
    held: int | None = None
    back_in_s: float | None = None
    health: str = "offline"  # what status, the live page and metrics show
    rows_per_s: float = 0.0  # average since the run started
    tokens_per_s: float = 0.0
    recent_rows_per_s: float | None = None  # over the last --watch interval
    recent_tokens_per_s: float | None = None


@dataclass
class RunStatus:
    run: str
    state: str
    total: int | None  # known once the producer has read the whole input
    read: int
    queued: int
    in_flight: int
    done: int
    failed: int
    rejected: int
    truncated: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    written: int
    elapsed_s: float
    rows_per_s: float
    tokens_per_s: float
    eta_s: float | None
    at: float = 0.0  # when this snapshot was taken (epoch s)
    recent_rows_per_s: float | None = None
    recent_tokens_per_s: float | None = None
    workers: list[WorkerStatus] = field(default_factory=list)
    # The early-warning figures (`produce --stop-if`): answers with no text, and answers that
    # ran out of budget inside their reasoning.
    empty: int = 0
    unfinished: int = 0
    stop_reason: str | None = None
    # --turns all: later turns held back by a failed turn (settled until `fleetgen retry`).
    blocked: int = 0
    # Requests of the rows held out (--holdout): never sent, settled in holdout.jsonl.
    holdout: int = 0
    # Failures the workers have written, counting those a `fleetgen retry` has since fixed
    # (`failed` is what stands now).
    failed_attempts: int = 0
    # Prompts held by lost workers, and the seconds until the last of them is back in the queue.
    lost_held: int = 0
    lost_back_in_s: float | None = None
    # Why the run is not moving though it is not over (no worker alive), else None.
    idle: str | None = None
    # The engines fleetgen started (`--engine-cmd`), by HOST/engineN: phase, restarts, URL.
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def truncation_rate(self) -> float:
        return self.truncated / self.done if self.done else 0.0

    def share(self, count: int) -> float:
        """Of the answers so far (results and failures), as `--stop-if` judges them."""
        answers = self.done + self.failed
        return count / answers if answers else 0.0

    @property
    def remaining(self) -> int | None:
        if self.total is None:
            return None
        return max(self.total - self.done - self.failed - self.rejected - self.holdout
                   - self.blocked, 0)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["truncation_rate"] = round(self.truncation_rate, 4)
        data["lost_line"] = lost_line(self) if self.lost_held else None
        data["shares"] = {name: round(self.share(count), 4) for name, count in (
            ("truncated", self.truncated), ("empty", self.empty),
            ("unfinished", self.unfinished), ("failed", self.failed))}
        return data


def gather(client: redis.Redis, run: str, now: float | None = None) -> RunStatus | None:
    keys = run_keys(run)
    manifest = RunManifest(client, run).read()
    if not manifest.exists:
        return None
    stats = read_hash(client, keys.stats)
    written = read_hash(client, keys.written)
    # Heartbeats and leases are on Valkey's clock; a test passes its own `now` for both.
    clock = now or server_time(client)
    now = now or time.time()
    state = manifest.state or "?"
    if state == STATE_PRODUCED and run_complete(client, run, manifest=manifest):
        state = STATE_COMPLETE
    started = manifest.started_at if manifest.started_at is not None else now
    # A run that has ended (the drainer pinned when) stops its clock there, as summary.json.
    ended = (manifest.finished_at or 0) if state != STATE_PRODUCING else 0
    # Less the time it stood stopped before a resume, as summary.json's wall_s.
    paused = manifest.paused_s
    elapsed = max((ended or now) - started - paused, 1e-9)

    def n(source: dict[str, str], name: str) -> int:
        return int(source.get(name, 0) or 0)

    # Counted as the files do once the drainer has written all there is (the stream is empty,
    # and it publishes its counts with every batch): a row delivered twice is one line there,
    # whatever the workers' counters say (a worker of a version without the done-bit check
    # counts its late answer). Until then the counters, which run ahead of the files.
    drained = bool(written) and not client.xlen(keys.stream)

    def outcome(name: str) -> int:
        return n(written if drained and name in written else stats, name)

    # Failed: the requests whose outcome stands as a failure (the workers keep each one's task
    # for `fleetgen retry`, and a later success removes it), as summary.json counts them; the
    # `failed` counter also holds failures that a retry has since turned into results.
    done, rejected = outcome("done"), outcome("rejected")
    failed = int(client.hlen(keys.failed))
    sent = int(client.bitcount(keys.sent))
    finished = int(client.bitcount(keys.done))
    queued = wire.queued(client)  # the shared queue and the workers' own
    # The exact count once the producer has read everything; until then the input's size.
    total = manifest.rows
    rate = (done + failed) / elapsed
    blocked = n(written, "blocked")
    remaining = (total if total is not None else manifest.read) - finished - blocked
    status = RunStatus(
        run=run, state=state, total=total, read=manifest.read,
        queued=queued, in_flight=max(sent - finished - queued, 0), done=done, failed=failed,
        rejected=rejected, truncated=outcome("truncated"), retries=n(stats, "retries"),
        prompt_tokens=outcome("prompt_tokens"), completion_tokens=outcome("completion_tokens"),
        written=(n(written, "done") + n(written, "failed") + n(written, "rejected")
                 + n(written, "holdout") + blocked),
        elapsed_s=round(elapsed, 1), rows_per_s=round(rate, 2),
        tokens_per_s=round(outcome("completion_tokens") / elapsed, 1),
        eta_s=(round(remaining / rate, 1) if rate > 0 and remaining > 0
               and state != STATE_COMPLETE else None), at=now,
    )
    status.failed_attempts = n(stats, "failed")
    status.empty, status.unfinished = outcome("empty"), outcome("reasoning_unfinished")
    status.stop_reason = manifest.stop_reason
    status.blocked = blocked
    status.holdout = outcome("holdout")
    beats = live_workers(client)  # one SCAN and an HGETALL a worker, for both readings
    status.workers = _workers(beats, stats, elapsed, clock)
    _lost_leases(client, beats, status, clock)
    status.idle = idle_line(status)
    status.engines = {name: orjson.loads(value) for name, value in
                      sorted(read_hash(client, keys.engines).items())}
    return status


def _lost_leases(client: redis.Redis, heartbeats: dict[str, dict[str, str]],
                 status: RunStatus, now: float) -> None:
    """The run's prompts whose lease no live worker renews (kombu's index, not a heartbeat's
    snapshot: a dead worker may have taken more after its last beat), and when the last of
    them is back in the queue: its lease, then a sweep."""
    beats = [Heartbeat.of(b) for b in heartbeats.values()]
    interval_s = max((b.interval_s for b in beats), default=DEFAULT_INTERVAL_S)
    lease_s = max((b.lease_s for b in beats if b.lease_s), default=VISIBILITY_TIMEOUT_S.default)
    scores = unrenewed_leases(client, status.run, now - LOST_AFTER_BEATS * interval_s)
    status.lost_held = len(scores)
    if scores:
        back = max(scores) + lease_s + sweep_interval_s(lease_s) - now
        status.lost_back_in_s = round(max(back, 0.0), 1)


def idle_line(s: RunStatus) -> str | None:
    """Why a run that is not over makes no progress: no worker is alive (a stopped demo or
    fleet; a worker's heartbeat lapses within three beats, its hash within a minute or so)."""
    if s.state in (STATE_COMPLETE, STATE_STOPPED):
        return None
    if any(not w.lost and w.health != "offline" for w in s.workers):
        return None
    return ("no worker is alive (no heartbeat): nothing is being generated; start the "
            "workers, or run the same command again to resume the run")


def live_workers(client: redis.Redis) -> dict[str, dict[str, str]]:
    """Heartbeats of every worker alive in the last minute, by node name."""
    prefix = worker_key("")
    return {text(key)[len(prefix):]: read_hash(client, text(key))
            for key in client.scan_iter(match=worker_key("*"), count=1000)}


def _workers(beats: dict[str, dict[str, str]], stats: dict[str, str], elapsed: float,
             now: float) -> list[WorkerStatus]:
    by_name: dict[str, WorkerStatus] = {}
    for key, value in stats.items():
        if "|" not in key:
            continue
        name, field_name = key.split("|", 1)
        w = by_name.setdefault(name, WorkerStatus(name))
        if field_name in ("done", "failed", "completion_tokens"):
            setattr(w, field_name, int(value))
    # Idle workers show too: an online GPU that does nothing is what one wants to spot.
    for name, beat in beats.items():
        _apply_heartbeat(by_name.setdefault(name, WorkerStatus(name)), beat, now)
    for w in by_name.values():
        w.rows_per_s = round(w.done / elapsed, 2)
        w.tokens_per_s = round(w.completion_tokens / elapsed, 1)
    return sorted(by_name.values(), key=lambda w: w.name)


def _apply_heartbeat(w: WorkerStatus, beat: dict[str, str], now: float) -> None:
    def flag(name: str) -> bool | None:
        return bool(int(beat[name])) if name in beat else None

    def number(name: str) -> int | None:
        return int(beat[name]) if beat.get(name, "").isdigit() else None

    w.healthy, w.consuming = flag("healthy"), flag("consuming")
    w.engine = beat.get("engine")
    w.in_flight, w.concurrency = number("inflight"), number("concurrency")
    w.limit_from, w.limit_max, w.paced = beat.get("limit_from"), number("limit_max"), \
        flag("paced")
    w.limit_note = beat.get("limit_note") or None
    w.engine_running, w.engine_waiting = number("engine_running"), number("engine_waiting")
    w.engine_slots = number("engine_slots")
    lease = Heartbeat.of(beat)
    w.lost, w.held = lease.lost(now), lease.held
    if w.lost:
        w.back_in_s = lease.back_in_s(now)
        w.back_in_s = None if w.back_in_s is None else round(w.back_in_s, 1)
    w.health = _health(w, lease.age_s(now))


def _health(w: WorkerStatus, age_s: float) -> str:
    if w.lost:
        return f"LOST (no heartbeat for {age_s:.0f} s)"
    if w.healthy is None:
        return "offline"
    if not w.healthy:
        return "ENGINE DOWN"
    return "ok" if w.consuming is not False else "paused"


def with_window(current: RunStatus, previous: RunStatus | None) -> RunStatus:
    """Rates over the interval since `previous` (what --watch shows), and an ETA from them:
    the average since the start hides a GPU that just went down."""
    if previous is None or current.at <= previous.at:
        return current
    dt = current.at - previous.at
    rows = (current.done + current.failed) - (previous.done + previous.failed)
    current.recent_rows_per_s = round(max(rows, 0) / dt, 2)
    current.recent_tokens_per_s = round(
        max(current.completion_tokens - previous.completion_tokens, 0) / dt, 1)
    remaining = current.remaining
    if remaining is not None:
        rate = current.recent_rows_per_s
        current.eta_s = round(remaining / rate, 1) if rate > 0 and remaining > 0 else None
    before = {w.name: w for w in previous.workers}
    for w in current.workers:
        old = before.get(w.name)
        if old is None:
            continue
        w.recent_rows_per_s = round(max(w.done + w.failed - old.done - old.failed, 0) / dt, 2)
        w.recent_tokens_per_s = round(
            max(w.completion_tokens - old.completion_tokens, 0) / dt, 1)
    return current


def render(s: RunStatus) -> str:
    total = "?" if s.total is None else str(s.total)
    eta = "-" if s.eta_s is None else _duration(s.eta_s)
    windowed = s.recent_rows_per_s is not None
    rows_s = s.recent_rows_per_s if windowed else s.rows_per_s
    tok_s = s.recent_tokens_per_s if windowed else s.tokens_per_s
    lines = [
        f"run {s.run}  [{s.state}]  elapsed {_duration(s.elapsed_s)}  ETA {eta}",
        f"  rows    total {total}  read {s.read}  queue depth {s.queued}  "
        f"in flight {s.in_flight}  written {s.written}",
        f"  outcome done {s.done}  failed {s.failed}  rejected {s.rejected}  "
        f"truncated {s.truncated} ({s.truncation_rate:.1%})  retries {s.retries}"
        + (f"  held out {s.holdout} requests" if s.holdout else "")
        + (f"  held back by failed turns {s.blocked}" if s.blocked else ""),
        f"  early   truncated {s.share(s.truncated):.1%}  empty {s.share(s.empty):.1%}  "
        f"unfinished reasoning {s.share(s.unfinished):.1%}  failed {s.share(s.failed):.1%}"
        " of answers",
        f"  rate    {rows_s or 0:.1f} rows/s  {tok_s or 0:.0f} tok/s "
        f"({'since last refresh' if windowed else 'average since start'})",
        f"  tokens  prompt {s.prompt_tokens}  completion {s.completion_tokens}",
    ]
    if s.stop_reason:
        lines.insert(1, f"  STOPPED EARLY: {s.stop_reason}")
    if s.lost_held:
        lines.insert(1, f"  WAITING {lost_line(s)}")
    if s.idle:
        lines.insert(1, f"  NOT MOVING: {s.idle}")
    if s.workers:
        lines.append(f"  {'worker':<28} {'done':>8} {'failed':>6} {'in flight':>9} "
                     f"{'rows/s':>8} {'tok/s':>9}  health")
        lines += [_worker_line(w) for w in s.workers]
    lines += [_engine_line(name, e) for name, e in s.engines.items()]
    return "\n".join(lines)


def _engine_line(name: str, e: dict[str, Any]) -> str:
    error = f"  last: {e['error']}" if e.get("error") else ""
    return (f"  engine {name:<21} {e.get('phase', '?'):<10} restarts {e.get('restarts', 0)}"
            f"  GPU {e.get('gpus', '?')}  {e.get('url', '?')}{error}")


def _worker_line(w: WorkerStatus) -> str:
    rows_s = w.recent_rows_per_s if w.recent_rows_per_s is not None else w.rows_per_s
    tok_s = w.recent_tokens_per_s if w.recent_tokens_per_s is not None else w.tokens_per_s
    in_flight = "-" if w.in_flight is None else f"{w.in_flight}/{w.concurrency or '?'}"
    line = (f"  {w.name:<28} {w.done:>8} {w.failed:>6} {in_flight:>9} {rows_s:>8.1f} "
            f"{tok_s:>9.0f}  {w.health}")
    return line if w.lost or not w.limit_from else f"{line}\n      {limit_line(w)}"


def limit_line(w: WorkerStatus) -> str:
    """The limit in force, where it comes from, the engine's queue, and whether the limit is
    what holds this engine back."""
    line = f"limit {w.concurrency}: {w.limit_from}"
    if w.limit_note:
        line += f"; {w.limit_note}"
    if w.engine_running is not None and w.engine_waiting is not None:
        line += f"; engine: {w.engine_running} running, {w.engine_waiting} waiting"
    if holds_back(w):
        line += ("; THIS LIMIT HOLDS THE ENGINE BACK: it has room (nothing waits) while "
                 f"every one of the {w.concurrency} is in flight; raise it ("
                 + ("FLEETGEN_MAX_IN_FLIGHT" if w.paced else "-c") + ")")
    return line


def holds_back(w: WorkerStatus) -> bool:
    """The worker uses its whole limit, all of it at the engine, which queues nothing and has
    free slots (as far as it says: one that reports K and runs K is full without a queue), and
    the limit cannot grow by itself (fixed, or paced up to its ceiling)."""
    if not w.concurrency or w.in_flight is None or w.engine_waiting != 0:
        return False
    running = w.engine_running or 0
    if w.engine_slots and running >= w.engine_slots:
        return False
    # Most of what the worker holds must be at the engine: when it is not, the worker's own
    # bookkeeping (a fast engine, a busy host) is what limits, not the limit.
    if running < w.in_flight * 3 // 4:
        return False
    in_use = w.in_flight >= w.concurrency - max(1, w.concurrency // 8)
    grows = bool(w.paced) and w.concurrency < (w.limit_max or 0)
    return in_use and not grows


def lost_line(s: RunStatus) -> str:
    """Why a run waits while its live workers idle: what lost workers hold, and until when."""
    names = ", ".join(w.name for w in s.workers if w.lost) or "(gone from view)"
    when = sweep_when(s.lost_back_in_s, any(can_sweep(w) for w in s.workers), _duration)
    return (f"{s.lost_held} prompt(s) held by lost worker(s) {names}: back in the queue {when}, "
            "when their leases lapse (FLEETGEN_VISIBILITY_TIMEOUT_S after the last heartbeat)")


def can_sweep(w: WorkerStatus) -> bool:
    """A worker whose heartbeat reaches Valkey: it (or another such) sweeps lapsed leases."""
    return not w.lost and w.health != "offline"


def sweep_when(back_in_s: float | None, sweeper: bool, duration: Any) -> str:
    """When lost workers' prompts are back in the queue. Only a worker that reaches Valkey
    sweeps: with none (every worker cut off from Valkey, or stopped), nothing comes back until
    one does, whatever the leases say (issue 52)."""
    if not sweeper:
        lapse = f" (their leases lapse within {duration(back_in_s)})" if back_in_s else ""
        return ("only once a worker reaches Valkey again: no worker's heartbeat does now, so "
                f"none can sweep{lapse}")
    return "at the next sweep" if not back_in_s else f"within {duration(back_in_s)}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def dumps(s: RunStatus, *, compact: bool = False) -> str:
    return orjson.dumps(s.to_json(), option=0 if compact else orjson.OPT_INDENT_2).decode()
