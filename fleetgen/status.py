"""A run's state from Redis alone: counts, rates, ETA, per-worker figures (no output files)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson
import redis

from fleetgen.contract import QUEUE, RunKeys, worker_key
from fleetgen.redisconn import read_hash


@dataclass
class WorkerStatus:
    name: str
    done: int = 0
    failed: int = 0
    completion_tokens: int = 0
    healthy: bool | None = None
    engine: str | None = None
    rows_per_s: float = 0.0
    tokens_per_s: float = 0.0


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
    workers: list[WorkerStatus] = field(default_factory=list)

    @property
    def truncation_rate(self) -> float:
        return self.truncated / self.done if self.done else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["truncation_rate"] = round(self.truncation_rate, 4)
        return data


def _hash(client: redis.Redis, key: str) -> dict[str, str]:
    return read_hash(client, key)


def gather(client: redis.Redis, run: str, now: float | None = None) -> RunStatus | None:
    keys = RunKeys(run)
    manifest = _hash(client, keys.manifest)
    if not manifest:
        return None
    stats = _hash(client, keys.stats)
    written = _hash(client, keys.written)
    now = now or time.time()
    started = float(manifest.get("started_at", now))
    elapsed = max(now - started, 1e-9)

    def n(source: dict[str, str], name: str) -> int:
        return int(source.get(name, 0) or 0)

    done, failed, rejected = n(stats, "done"), n(stats, "failed"), n(stats, "rejected")
    sent = int(client.bitcount(keys.sent))
    finished = int(client.bitcount(keys.done))
    queued = int(client.llen(QUEUE))
    total = int(manifest["total"]) if "total" in manifest else None
    rate = (done + failed) / elapsed
    remaining = (total if total is not None else n(manifest, "read")) - finished
    status = RunStatus(
        run=run, state=manifest.get("state", "?"), total=total, read=n(manifest, "read"),
        queued=queued, in_flight=max(sent - finished - queued, 0), done=done, failed=failed,
        rejected=rejected, truncated=n(stats, "truncated"), retries=n(stats, "retries"),
        prompt_tokens=n(stats, "prompt_tokens"), completion_tokens=n(stats, "completion_tokens"),
        written=n(written, "done") + n(written, "failed") + n(written, "rejected"),
        elapsed_s=round(elapsed, 1), rows_per_s=round(rate, 2),
        tokens_per_s=round(n(stats, "completion_tokens") / elapsed, 1),
        eta_s=round(remaining / rate, 1) if rate > 0 and remaining > 0 else None,
    )
    status.workers = _workers(client, stats, elapsed)
    return status


def _workers(client: redis.Redis, stats: dict[str, str], elapsed: float) -> list[WorkerStatus]:
    by_name: dict[str, WorkerStatus] = {}
    for key, value in stats.items():
        if "|" not in key:
            continue
        name, field_name = key.split("|", 1)
        w = by_name.setdefault(name, WorkerStatus(name))
        if field_name in ("done", "failed", "completion_tokens"):
            setattr(w, field_name, int(value))
    for w in by_name.values():
        beat = _hash(client, worker_key(w.name))
        w.healthy = bool(int(beat["healthy"])) if "healthy" in beat else None
        w.engine = beat.get("engine")
        w.rows_per_s = round(w.done / elapsed, 2)
        w.tokens_per_s = round(w.completion_tokens / elapsed, 1)
    return sorted(by_name.values(), key=lambda w: w.name)


def render(s: RunStatus) -> str:
    total = "?" if s.total is None else str(s.total)
    eta = "-" if s.eta_s is None else _duration(s.eta_s)
    lines = [
        f"run {s.run}  [{s.state}]  elapsed {_duration(s.elapsed_s)}  ETA {eta}",
        f"  rows    total {total}  read {s.read}  queued {s.queued}  in flight {s.in_flight}",
        f"  outcome done {s.done}  failed {s.failed}  rejected {s.rejected}  "
        f"truncated {s.truncated} ({s.truncation_rate:.1%})  retries {s.retries}",
        f"  written {s.written}   rate {s.rows_per_s:.1f} rows/s  {s.tokens_per_s:.0f} tok/s",
        f"  tokens  prompt {s.prompt_tokens}  completion {s.completion_tokens}",
    ]
    if s.workers:
        lines.append(f"  {'worker':<28} {'done':>8} {'failed':>6} {'rows/s':>8} {'tok/s':>9} "
                     "health")
        for w in s.workers:
            health = {True: "ok", False: "DOWN", None: "?"}[w.healthy]
            lines.append(f"  {w.name:<28} {w.done:>8} {w.failed:>6} {w.rows_per_s:>8.1f} "
                         f"{w.tokens_per_s:>9.0f} {health}")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def dumps(s: RunStatus) -> str:
    return orjson.dumps(s.to_json(), option=orjson.OPT_INDENT_2).decode()
