"""The producer of one run, as the CLI, the runner, the demo and the benches use it: `run` reads
the input once and enqueues what is neither done nor in flight, `wait_until_generated` stays
until every request has an outcome. The parts, each in its module: the pass over the input
(producer/inputpass.py: rows -> render -> tokenize once -> budget -> enqueue or reject), the
turn mode chosen once (producer/turnmode.py, `--turns all` in producer/allturns.py),
reconciliation (producer/reconcile.py) and early stop (producer/earlystop.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis

from fleetgen.base.contract import RunKeys
from producer.affinity import Affinity
from producer.allturns import AllTurns
from producer.budget import Limits
from producer.dedup import SeenIds
from producer.earlystop import EarlyStop, parse_rule
from producer.enqueue import Enqueuer
from producer.holdout import HoldOut
from producer.inputpass import InputPass
from producer.inputs import resolve_input
from producer.manifest import RunManifest, recorded_in
from producer.outbox import Outbox
from producer.progress import Progress
from producer.prompts import Prompts
from producer.reconcile import Reconciler
from producer.request import RequestOptions
from producer.rows import count_rows
from producer.settings import ProducerSettings
from producer.tokenizer import PromptTokenizer
from producer.turnmode import LastTurn, TurnMode
from producer.turns import WrittenTurns

log = logging.getLogger("fleetgen.producer")


class Producer:
    def __init__(self, settings: ProducerSettings, tokenizer: PromptTokenizer,
                 client: redis.Redis, enqueuer: Enqueuer, limits: Limits) -> None:
        self.s = settings
        self.tokenizer = tokenizer
        self.redis = client
        self.enqueuer = enqueuer
        self.limits = limits
        self.keys = RunKeys(settings.run)
        self.run_manifest = RunManifest(client, settings.run, settings.new_run,
                                        recorded_in(settings.out, settings.run))
        self.reconciler = Reconciler(client, settings.run)
        self.affinity = Affinity(client, enabled=settings.affinity,
                                 wait_s=settings.affinity_wait_s)
        # Resolved once: every pass of this producer reads the same files, in the same order.
        self.inputs = resolve_input(settings.input)
        self.options = RequestOptions(settings, tokenizer, limits)
        self.prompts = Prompts(tokenizer, limits, self.options)
        self.outbox = Outbox(enqueuer, self.affinity)
        rules = [] if settings.ignore_stop else [parse_rule(r) for r in settings.stop_if]
        self.early = EarlyStop(client, settings.run, rules, settings.stop_after)
        self.turns = self._turn_mode()
        self._seen_ids = SeenIds()  # ~8 bytes a row (bench/memory.py weighs it)
        self.input_pass = InputPass(self.inputs, settings.batch_size, settings.n, self.prompts,
                                    self.outbox, self.turns, self.run_manifest, self._seen_ids,
                                    HoldOut(settings.holdout))
        self._settings: dict[str, Any] = {}
        self.total: int | None = None  # rows in the input, once all of it has been read

    def _turn_mode(self) -> TurnMode:
        if self.s.turns != "all":
            return LastTurn(self.reconciler, self.affinity)
        # The drainer's files, followed for the answers each next turn is built from.
        assert self.s.out is not None
        written = WrittenTurns(self.s.out, self.s.run)
        written.check_owner()
        return AllTurns(written, self.reconciler, self.prompts, self.outbox, self.affinity)

    @property
    def progress(self) -> Progress:
        """The last pass's (the run's own until a lost row is re-enqueued)."""
        return self.outbox.progress

    # -- the run ---------------------------------------------------------------------------
    def run(self, on_batch: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False) -> Progress:
        """Enqueue every row that is neither done nor in flight (all of them on a first run;
        what an interrupted run left on a resumed one), then mark the run produced."""
        settings = self.s.manifest_settings(files=self.inputs.names)
        settings["context_length"] = self.limits.context_length
        self._settings = settings
        stopped = self.run_manifest.stop_reason()
        if stopped is not None and not self.s.ignore_stop:
            self.progress.stopped = stopped  # stopped before: say so, change nothing
            return self.progress
        # The size before reading, not after: a row appended while this pass reads may be
        # missed by it, and must then count as a change the next `produce` reads again.
        input_bytes = self.inputs.size_bytes()
        self.run_manifest.open(settings, count_rows(self.inputs) * self.s.n)
        done = self.reconciler.done()
        in_flight = self.reconciler.in_flight()
        progress = self._pass(lambda line: line not in done and line not in in_flight,
                              on_batch, should_stop)
        if self.early.verdict is not None:
            self._stop_early(self.early.verdict.reason(), should_stop)
        elif not should_stop():
            self.total = self.input_pass.slots_read  # requests: rows x samples
            self.run_manifest.close(self.total, input_bytes, input_rows=progress.read)
        return progress

    def _stop_early(self, reason: str, should_stop: Callable[[], bool]) -> None:
        """Enqueue nothing more, let what is queued or in flight finish, then report."""
        log.warning("stopping the run early: %s", reason)
        self.run_manifest.stop(reason)
        self.progress.stopped = reason
        self.early.wait_for_sent(should_stop)

    def requeue(self, lines: set[int], should_stop: Callable[[], bool] = lambda: False) -> None:
        """Enqueue these lines again (a pass over the input that keeps only them)."""
        self._pass(lines.__contains__, None, should_stop)

    def _pass(self, wanted: Callable[[int], bool],
              on_batch: Callable[[Progress], None] | None,
              should_stop: Callable[[], bool]) -> Progress:
        return self.input_pass.run(wanted, on_batch,
                                   lambda: should_stop() or self.early.triggered())

    def follow_turns(self) -> int:
        """--turns all: enqueue the next turns the drainer's files made possible since the
        last look (0 with --turns last)."""
        return self.turns.follow()

    # -- reconciliation (producer/reconcile.py) ---------------------------------------------
    # The producer is the one that knows the input and its total: while it waits it writes
    # them back whenever Redis forgets them (restarted from an older copy of its data).
    def lost_lines(self) -> set[int]:
        assert self.total is not None, "run() first: the total is known once all is read"
        return self.reconciler.lost_lines(self.total)

    def wait_until_generated(self, interval_s: float = 30.0,
                             should_stop: Callable[[], bool] = lambda: False,
                             on_tick: Callable[[int, int], None] | None = None) -> int:
        total = self.total
        assert total is not None, "run() first: the total is known once all is read"
        return self.turns.wait(total, lambda lines: self.requeue(lines, should_stop),
                               lambda: self.run_manifest.reassert(self._settings, total),
                               interval_s, should_stop, on_tick)

    def manifest(self) -> dict[str, str]:
        return self.run_manifest.read()
