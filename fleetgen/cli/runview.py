"""What `fleetgen run` and the demo say while their run goes, in the terminal (or log) they were
started from: an engine that stops answering, that its prompts go back to the queue, when it
answers again; the engines up in the progress line; and, in a log, a line every few seconds
with an ETA that counts the answers still running. Read from the workers' heartbeats as
`fleetgen status` reads them (fleetgen/monitor/status.py, fleetgen/queue/heartbeat.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from fleetgen.cli.progress import LINE_EVERY_S, duration
from fleetgen.monitor import status
from fleetgen.queue.serverclock import ServerClock

# How often the run reads its workers' heartbeats: they beat every FLEETGEN_HEALTH_INTERVAL_S
# (2 s by default), so reading faster shows nothing new.
LOOK_EVERY_S = 2.0


@dataclass
class EngineState:
    """One server as the run sees it: up while a live worker reports it answering."""

    url: str
    up: bool = True
    since: float = 0.0  # when it went down or came back (epoch s)
    in_flight: int = 0  # what its workers held at the last look while it was up
    # Answering seen by this run: until then nothing is said of it. On a resume the stopped
    # run's workers' heartbeats linger (lost) before this run's own first beat, and were said
    # as "stopped (no heartbeat)", once a worker, each time.
    seen: bool = False
    lost: bool = False  # down because its worker's heartbeat stopped (dead, or cut off)


class FleetView:
    """The run's engines from its workers' heartbeats: `look()` says each change once (down,
    lost, back), and `engines_up` / `in_flight` feed the progress line."""

    def __init__(self, client: redis.Redis, run: str, engines: list[str],
                 say: Callable[[str], None], *,
                 clock: Callable[[], float] | None = None) -> None:
        self._client, self._run, self._say = client, run, say
        # Heartbeats are written on Valkey's clock: read them on it too (a --redis on a host
        # whose clock differs from this one's must not make a live worker look lost).
        self._clock = clock or ServerClock(client).now
        self.engines = {_key(u): EngineState(_key(u)) for u in engines}
        self.limits = LimitNotes(say)
        self.in_flight: int | None = None
        self._due = 0.0

    @property
    def engines_up(self) -> tuple[int, int]:
        return sum(e.up for e in self.engines.values()), len(self.engines)

    def look(self) -> None:
        """At most every LOOK_EVERY_S: the run's status, each engine's change said once."""
        now = self._clock()
        if now < self._due:
            return
        self._due = now + LOOK_EVERY_S
        try:
            s = status.gather(self._client, self._run, now)
        except redis.RedisError:  # the drainer rides out an outage and says so itself
            return
        if s is None:
            return
        self.in_flight = s.in_flight
        self._update(s.workers, now)

    def _update(self, workers: list[status.WorkerStatus], now: float) -> None:
        by_engine: dict[str, list[status.WorkerStatus]] = {}
        for w in workers:
            if w.engine:
                by_engine.setdefault(_key(w.engine), []).append(w)
        for url in by_engine:  # a worker joined from another host: its engine too
            self.engines.setdefault(url, EngineState(url, since=now))
        for engine in self.engines.values():
            ws = by_engine.get(engine.url, [])
            answering = [w for w in ws if _answering(w)]
            self.limits.note(engine.url, answering)
            if answering:
                engine.in_flight = sum(w.in_flight or 0 for w in answering)
            if not engine.seen:
                engine.seen, engine.up = bool(answering), bool(answering)
                continue
            if bool(answering) == engine.up:
                continue
            names = ", ".join(w.name for w in answering)
            if answering and engine.lost:
                self._say(f"worker {names} of engine {engine.url} back at {_clock(now)} (lost "
                          f"{duration(now - engine.since)}): it takes prompts again")
            elif answering:
                self._say(f"engine {engine.url} answers again at {_clock(now)} (down "
                          f"{duration(now - engine.since)}): worker {names} takes prompts "
                          "again")
            else:
                self._say(self._gone_line(engine, ws, now, any(map(status.can_sweep, workers))))
            engine.up, engine.since = bool(answering), now
            engine.lost = not answering and any(w.lost for w in ws)

    @staticmethod
    def _gone_line(engine: EngineState, workers: list[status.WorkerStatus], now: float,
                   sweeper: bool = True) -> str:
        if not workers:
            return (f"engine {engine.url} has no worker alive since {_clock(now)}: nothing is "
                    "sent to it")
        names = ", ".join(w.name for w in workers)
        held = engine.in_flight
        prompts = f"the {held} prompt(s) it was answering go" if held else "its prompts go"
        lost = [w for w in workers if w.lost]
        if lost:
            back = max((w.back_in_s or 0.0) for w in lost)
            when = status.sweep_when(back, sweeper, duration)
            return (f"worker {names} of engine {engine.url} LOST at {_clock(now)} (no "
                    f"heartbeat: stopped, or cut off from Valkey): {prompts} back to the queue "
                    f"{when}" + (", when its leases lapse" if sweeper else ""))
        return (f"engine {engine.url} stopped answering at {_clock(now)} (worker {names}: "
                f"{workers[0].health}): {prompts} back to the queue for the other engines; "
                "its worker takes prompts again once it answers")


class LimitNotes:
    """Says, per engine, how many requests are in flight, the limit in force and where it comes
    from: once it has settled (two looks within a tenth of each other), again when it moves by
    a quarter or its source changes; and once when the limit is what holds the engine back."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._last: dict[str, int] = {}  # the limit at the last look
        self._said: dict[str, tuple[int, str]] = {}  # the limit and source last said
        self._holding: set[str] = set()

    def note(self, url: str, workers: list[status.WorkerStatus]) -> None:
        live = [w for w in workers if w.limit_from and w.concurrency]
        if not live:
            return
        limit = sum(w.concurrency or 0 for w in live)
        source = live[0].limit_from or ""
        last, self._last[url] = self._last.get(url), limit
        settled = last is not None and abs(limit - last) <= last / 10
        said = self._said.get(url)
        moved = said is None or said[1] != source or abs(limit - said[0]) > said[0] / 4
        if settled and moved:
            self._say(f"engine {url}: {self.in_flight_words(live, limit)} ({source})")
            self._said[url] = (limit, source)
        holding = [w for w in live if status.holds_back(w)]
        if holding and url not in self._holding:
            self._say(f"engine {url}: {status.limit_line(holding[0])}")
            self._holding.add(url)
        elif not holding:
            self._holding.discard(url)

    @staticmethod
    def in_flight_words(live: list[status.WorkerStatus], limit: int) -> str:
        words = f"{sum(w.in_flight or 0 for w in live)} in flight, limit {limit}"
        queue = [w for w in live if w.engine_running is not None]
        if queue:
            words += (f"; its queue: {queue[0].engine_running} running, "
                      f"{queue[0].engine_waiting} waiting")
        return words


def _answering(w: status.WorkerStatus) -> bool:
    """A live worker whose engine answers (taking prompts or about to: `paused` is a gate
    that opens at its next beat)."""
    return not w.lost and bool(w.healthy)


def _key(url: str) -> str:
    return url.rstrip("/")


def _clock(epoch_s: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch_s))


def eta_s(remaining: int, in_flight: int | None, rate: float,
          answer_s: float | None) -> float | None:
    """Seconds until the last request is written: the ones not started yet at the fleet's
    rate, then about one answer's time for those still running (a rate alone says "0 min"
    while the last long answers still generate). None while there is no rate."""
    if remaining <= 0:
        return 0.0
    if rate <= 0:
        return None
    if in_flight is None or answer_s is None:
        return remaining / rate
    waiting = max(remaining - in_flight, 0)
    return waiting / rate + (answer_s if min(in_flight, remaining) > 0 else 0.0)


class LogLine:
    """Where no bar is drawn: every LINE_EVERY_S, the requests written of the total, the rate
    since the first figure (a resumed run's earlier rows do not make it look fast), the
    engines up and the ETA. An answer's time comes from Little's law: the mean in flight over
    the mean rate."""

    def __init__(self, say: Callable[[str], None], *, show: bool | None = None,
                 every_s: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._say, self._every_s, self._clock = say, every_s, clock
        self._show = not sys.stderr.isatty() if show is None else show
        self._first: tuple[float, int] | None = None
        self._due = clock() + every_s
        self._flight_area = 0.0  # in flight x seconds since the first figure
        self._last_at: float | None = None

    def tick(self, written: int, total: int | None, *, in_flight: int | None = None,
             engines: tuple[int, int] | None = None, note: str = "") -> None:
        """`note`: what the engines' supervisor adds (restarts, parked engines)."""
        now = self._clock()
        if self._first is None:
            self._first = (now, written)
        if in_flight is not None and self._last_at is not None:
            self._flight_area += in_flight * (now - self._last_at)
        self._last_at = now
        if not self._show or now < self._due:
            return
        self._due = now + self._every_s
        self._say(self.line(now, written, total, in_flight, engines, note))

    def line(self, now: float, written: int, total: int | None, in_flight: int | None,
             engines: tuple[int, int] | None, note: str = "") -> str:
        since, n0 = self._first or (now, written)
        elapsed = max(now - since, 1e-9)
        rate = (written - n0) / elapsed
        answer_s = self._flight_area / elapsed / rate if rate > 0 and self._flight_area else None
        left = None if total is None else eta_s(total - written, in_flight, rate, answer_s)
        of = "?" if total is None else f"{total:,}"
        up = f", engines {engines[0]}/{engines[1]}" if engines else ""
        up += f" ({note})" if note else ""
        return (f"{written:,}/{of} requests written, {rate:,.1f}/s{up}, ETA "
                f"{'-' if left is None else duration(left)}")
