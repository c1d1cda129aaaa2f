"""The producer's loop (`Producer`): one producer run as a sequence of ticks
(docs/architecture.md draws them). It holds the resolved input and, once the pass has read all
of it, the run's total; the CLI, the runner, the demo and the benches use it. `send_pass` is
the pass over the input that enqueues the rows (a tick per batch), `wait_until_generated`
stays until every request has an outcome (a tick per look). Every tick calls down: the
affinity's sweep, the turn mode's follow and its answers (settled, lost), the manifest's
reassert; nothing below calls back up."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from fleetgen.runstate.keys import run_keys
from producer.affinity import Affinity
from producer.allturns import AllTurns
from producer.budget import Limits
from producer.dedup import SeenIds
from producer.earlystop import EarlyStop, parse_rule
from producer.enqueue import Enqueuer
from producer.holdout import HoldOut
from producer.inputpass import InputPass, PassParts
from producer.inputs import Inputs
from producer.manifest import CheckedManifest, Recorded
from producer.outbox import Outbox
from producer.progress import Progress
from producer.prompts import Prompts
from producer.reconcile import Reconciler, Suspects
from producer.request import RequestOptions
from producer.reuse import EarlierAnswers
from producer.rows import check_readable
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer
from producer.turnmode import LastTurn, TurnMode
from producer.turns import WrittenTurns

log = logging.getLogger("fleetgen.producer")

# How often a pass looks at full queues (and sends next turns meanwhile).
ROOM_POLL_S = 0.05


@dataclass(frozen=True)
class Plan:
    """What one run is given once, resolved by its caller: its input's files, and whether
    this producer stays until every request has an outcome; only then does it route first
    turns to workers' own queues, which it is there to sweep."""

    inputs: Inputs
    waits: bool = False
    # The output directory's record of the run, as its caller read it (the resume check):
    # None when there is none (no --out, a new one, another run's).
    recorded: Recorded | None = None
    # Answers made before the run that it writes instead of sending their rows (`fleetgen
    # run` after `fleetgen estimate`: producer/reuse.py); None: every row is sent.
    reuse: EarlierAnswers | None = None


class Producer:
    def __init__(self, settings: ProducerSettings, tokenizer: PromptTokenizer,
                 client: redis.Redis, enqueuer: Enqueuer, limits: Limits,
                 plan: Plan) -> None:
        self.s = settings
        self.limits = limits
        self.enqueuer = enqueuer
        # Resolved once: every pass of this run reads the same files, in the same order.
        self.inputs = plan.inputs
        self.run_manifest = CheckedManifest(client, settings.run, settings.new_run,
                                            plan.recorded)
        self.affinity = Affinity(client, enabled=settings.affinity,
                                 wait_s=settings.affinity_wait_s, route_first=plan.waits)
        keys = run_keys(settings.run)  # the run's Redis keys, named once for its parts
        self.reconciler = Reconciler(client, keys)
        self.prompts = Prompts(tokenizer, limits, RequestOptions(settings, tokenizer, limits))
        self.outbox = Outbox(enqueuer, self.affinity)
        rules = [] if settings.ignore_stop else [parse_rule(r) for r in settings.stop_if]
        self.early = EarlyStop(client, keys, rules, settings.stop_after)
        self.turns = self._turn_mode()
        parts = PassParts(self.prompts, self.outbox, self.turns, self.run_manifest, plan.reuse)
        self.input_pass = InputPass(self.inputs, settings.batch_size, settings.n, parts,
                                    SeenIds(), HoldOut(settings.holdout))
        self._settings: dict[str, Any] = {}
        self.total: int | None = None  # requests in the run, once all the input is read
        # Set by the drainer's side once it has written every row (`wake`): the wait looks
        # again at once instead of at its next tick.
        self._woken = threading.Event()
        self._opened = False
        self._input_bytes = 0

    def _turn_mode(self) -> TurnMode:
        if self.s.turns != "all":
            return LastTurn(self.reconciler)
        # The drainer's files, followed for the answers each next turn is built from.
        assert self.s.out is not None
        written = WrittenTurns.of_run(self.s.out, self.s.run)
        return AllTurns(written, self.reconciler, self.prompts, self.outbox)

    @property
    def progress(self) -> Progress:
        """The last pass's (the run's own until a lost row is re-enqueued)."""
        return self.outbox.progress

    # -- the pass: a tick per batch --------------------------------------------------------
    def send_pass(self, on_batch: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> Progress:
        """Enqueue every row that is neither done nor in flight (all of them on a first run;
        what an interrupted run left on a resumed one), then mark the run produced."""
        if not self._opened and not self.open():
            return self.progress
        done = self.reconciler.done()
        in_flight = self.reconciler.in_flight()
        progress = self._pass(lambda slot: slot not in done and slot not in in_flight,
                              on_batch, should_stop)
        if self.early.verdict is not None:
            self._stop_early(self.early.verdict.reason(), should_stop)
        elif not should_stop():
            self.total = self.input_pass.slots_read  # requests: rows x samples
            self.run_manifest.close(self.total, self._input_bytes, input_rows=progress.read)
        return progress

    def open(self) -> bool:
        """The run opened (or reopened) for this pass, before its first row; False for a run
        stopped by --stop-if before, which stays stopped and changed (without --ignore-stop).
        A caller that runs the pass in a thread opens it first, so that the run is open (not
        stopped, not complete) by the time the drainer beside it looks."""
        settings = self.s.manifest_settings(files=self.inputs.names)
        settings["context_length"] = self.limits.context_length
        self._settings = settings
        stopped = self.run_manifest.stop_reason()
        if stopped is not None and not self.s.ignore_stop:
            self.progress.stopped = stopped  # stopped before: say so, change nothing
            return False
        # The size before reading, not after: a row appended while this pass reads may be
        # missed by it, and must then count as a change the next `produce` reads again.
        self._input_bytes = self.inputs.size_bytes()
        check_readable(self.inputs)  # before the run is opened on files it cannot read
        # Not counted beforehand: that would be a whole read of the input before the first
        # row is sent. The total is the pass's own count, known at its end.
        self.run_manifest.open(settings)
        self._opened = True
        return True

    def _pass(self, wanted: Callable[[int], bool],
              on_batch: Callable[[Progress], None] | None,
              should_stop: Callable[[], bool]) -> Progress:
        def stop() -> bool:
            return should_stop() or self.early.triggered()

        progress = self.outbox.new_pass()
        for chunk in self.input_pass.chunks():
            if stop():
                break
            self._wait_for_room(stop)
            if stop():
                break
            self.affinity.sweep()  # at most every wait_s: cheap on every batch
            self.input_pass.send(chunk, wanted, progress)
            self.turns.follow()
            if on_batch:
                on_batch(progress)
        return progress

    def _wait_for_room(self, stop: Callable[[], bool]) -> None:
        """While the queues hold the high-water mark: sweep the workers' queues (a lost
        worker's first turns back to the shared queue: a long pass must not hold them until
        its end) and send next turns, which do not wait for room (no waves)."""
        while self.enqueuer.full() and not stop():
            self.affinity.sweep()
            self.turns.follow()
            time.sleep(ROOM_POLL_S)

    def _stop_early(self, reason: str, should_stop: Callable[[], bool]) -> None:
        """Enqueue nothing more, let what is queued or in flight finish, then report."""
        log.warning("stopping the run early: %s", reason)
        self.run_manifest.stop(reason)
        self.progress.stopped = reason
        self.early.wait_for_sent(should_stop)

    def requeue(self, slots: set[int], should_stop: Callable[[], bool] = lambda: False) -> None:
        """Enqueue these first turns again (a pass over the input that keeps only them)."""
        self._pass(slots.__contains__, None, should_stop)

    def follow_turns(self) -> int:
        """--turns all: enqueue the next turns the drainer's files made possible since the
        last look (0 with --turns last)."""
        return self.turns.follow()

    # -- the wait: a tick per look ---------------------------------------------------------
    # The producer is the one that knows the input and its total: while it waits it writes
    # them back whenever Redis forgets them (restarted from an older copy of its data).
    def lost_lines(self) -> set[int]:
        return self.turns.lost(self._total())

    def wait_until_generated(self, interval_s: float = 30.0,
                             should_stop: Callable[[], bool] = lambda: False,
                             on_tick: Callable[[int, int], None] | None = None) -> int:
        """Tick until every slot is settled; a slot seen lost at two checks `interval_s`
        apart is sent again. Returns how many were."""
        total = self._total()
        wait = _Wait(interval_s)
        while not should_stop():
            try:
                settled, over = self._look(total)
                if on_tick:
                    on_tick(settled, total)
                if over:
                    break
                if wait.due():
                    wait.requeued += self._recover(wait.suspects.confirm(
                        self.turns.lost(total)), should_stop)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Past the client's own retries: keep waiting, Redis may come back.
                log.warning("Redis unreachable while waiting for the run (%s); retrying", exc)
            # SIGTERM ends it at once; `wake` ends the pause.
            if self._woken.wait(min(0.5, interval_s, self.affinity.wait_s)):
                self._woken.clear()
        return wait.requeued

    def wake(self) -> None:
        """The drainer beside this producer has written every row: the wait's next look is
        now, not up to half a second later (the run, and `fleetgen run`, ended only when this
        thread did: issue 48's fleet bench lost 0.2-0.3 s a run to it)."""
        self._woken.set()

    def _look(self, total: int) -> tuple[int, bool]:
        """One look at the run: (slots settled, whether all of them are)."""
        self.affinity.sweep()  # a lost or saturated worker's queue back to the shared one
        if self.run_manifest.reassert(self._settings, total):
            log.warning("the run's manifest had lost its total or state (Redis restarted "
                        "from an older copy?); re-asserted total=%d", total)
        outstanding = self.turns.outstanding()  # before the files: AllTurns.outstanding
        self.turns.follow()
        settled = self.turns.settled()
        return settled, settled >= total and not outstanding

    def _recover(self, lost: set[int], should_stop: Callable[[], bool]) -> int:
        """Send confirmed lost slots again: first turns by a pass over the input that keeps
        only them, next turns built again from the written turn before."""
        if not lost:
            return 0
        log.warning("re-enqueueing %d request(s) that were lost (neither queued, in flight "
                    "nor done)", len(lost))
        first = self.turns.first_turns(lost)
        if first:
            self.requeue(first, should_stop)
        self.turns.resend(lost - first)
        return len(lost)

    def _total(self) -> int:
        assert self.total is not None, "send_pass() first: the total is known once all is read"
        return self.total

    def manifest(self) -> dict[str, str]:
        return self.run_manifest.read()


class _Wait:
    """One wait's state: the slots suspected lost, how many were sent again, the next check."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.suspects = Suspects()
        self.requeued = 0
        self.next_check = time.monotonic() + interval_s

    def due(self) -> bool:
        if time.monotonic() < self.next_check:
            return False
        self.next_check = time.monotonic() + self.interval_s
        return True
