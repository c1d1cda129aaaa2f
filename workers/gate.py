"""The health gate: a Celery consumer step that stops taking prompts while the worker's engine
is gone and takes them again once it is back, and publishes the worker's heartbeat."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from celery import bootsteps
from celery.platforms import EX_OK
from celery.worker import state as worker_state

from fleetgen.queue import closing, heartbeat
from fleetgen.queue.celeryconf import sweep_interval_s
from fleetgen.queue.contract import QUEUE, closing_key, worker_key, worker_queue
from workers import pacing, runtime
from workers.beat import Beat
from workers.state import state

log = logging.getLogger("fleetgen.worker")


class HealthGate(bootsteps.StartStopStep):
    """Runs on Celery's consumer loop, so it must never wait on the network: the probing is
    the runtime's `Watch` thread and the heartbeat the `Beat` thread (workers/beat.py); this
    step only reads their last answers. Slow (connected,
    answering late) keeps the gate open; gone (refused or not ready past
    FLEETGEN_ENGINE_GONE_S, or never up yet) closes it. Prompts already held are handed back
    by the task itself (`EngineGone` -> Reject(requeue=True))."""

    requires: ClassVar[set[str]] = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._tref: Any = None
        self._consuming = True
        self._leaving = False
        self._beat: Beat | None = None  # one a process: it outlives a consumer restart

    def start(self, c: Any) -> None:
        rt = runtime.get()
        # The first probe is made here, before the first prompt: a worker beside an SGLang
        # server that is still loading its weights must not take (and bounce) prompts.
        rt.watch.start()
        c.add_task_queue(worker_queue(rt.worker))  # the next turns of what it answered
        if not self._consuming:  # a consumer restarted while closed: declared before the loop
            c.app.amqp.queues[QUEUE](c.task_consumer.channel).declare()
        if self._beat is None:
            s = rt.settings
            self._beat = Beat(lambda: self._send_beat(c), worker=rt.worker,
                              interval_s=s.health_interval_s, lease_s=s.visibility_timeout_s,
                              held=lambda: self._held(c))
            self._beat.start()
        self.check(c)
        self._tref = c.timer.call_repeatedly(rt.settings.health_interval_s, self.check, (c,),
                                             priority=10)

    def stop(self, c: Any) -> None:
        if self._tref is not None:
            self._tref.cancel()
            self._tref = None

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        if self._beat is not None:
            self._beat.stop()
        rt = runtime.get()
        rt.watch.stop()
        if self._leaving:
            try:
                rt.redis.delete(worker_key(rt.worker))
            except Exception:  # the run stops its Redis at its deadline anyway
                log.debug("heartbeat not removed", exc_info=True)

    def check(self, c: Any) -> None:
        rt = runtime.get()
        watch = rt.watch
        if self._consuming and watch.gone():
            log.warning("engine %s gone (%s, down %.1f s): %s stops taking prompts",
                        rt.engine.base_url, watch.last.detail, watch.down_for_s(), rt.worker)
            c.cancel_task_queue(QUEUE)
            c.cancel_task_queue(worker_queue(rt.worker))
            self._consuming = False
        elif not self._consuming and watch.last.ready:
            log.warning("engine %s ready again: %s takes prompts", rt.engine.base_url,
                        rt.worker)
            take_again(c, QUEUE)
            take_again(c, worker_queue(rt.worker))
            self._consuming = True
        if self._beat is not None:
            self._beat.check()
            ended = self._beat.closing
            if ended is not None and not self._leaving:
                self._leave(rt, ended)

    @staticmethod
    def _held(c: Any) -> int:
        try:
            return int(c.task_consumer.channel.qos.held())
        except Exception:  # between two consumers of a restart: nothing to count
            return 0

    def _send_beat(self, c: Any) -> str | None:
        """The beat and the lease renewal together (on the beat thread): what the beat says
        the worker holds is what it has just renewed, so `status` never shows a live worker's
        prompts as lost. Returns the closing key's value."""
        rt = runtime.get()
        watch = rt.watch
        s = rt.settings
        sweep_s = sweep_interval_s(s.visibility_timeout_s)
        key = worker_key(rt.worker)
        qos = c.task_consumer.channel.qos
        # One script (`QoS.beat`): the beat's `at` is the renewal's time on Valkey's clock,
        # what `status` compares it with.
        fields: dict[Any, Any] = {
            "engine": rt.engine.base_url, "healthy": int(watch.up()),
            "engine_state": watch.last.state.value, "consuming": int(self._consuming),
            "inflight": runtime.in_flight_count(), "silent_s": silent_s(),
            **pacing.beat_fields(runtime.pace(), runtime.concurrency()),
            **heartbeat.lease_fields(interval_s=s.health_interval_s,
                                     lease_s=s.visibility_timeout_s, sweep_s=sweep_s,
                                     held=qos.held())}
        ttl = heartbeat.ttl_s(s.health_interval_s, s.visibility_timeout_s, sweep_s)
        return closing.closing(qos.beat(key, fields, ttl, closing_key()))

    def _leave(self, rt: runtime.Runtime, run: str) -> None:
        """The run this Redis served is complete and the Redis stops next (`fleetgen run`
        announced it): a worker that joined it exits 0 instead of retrying a Redis that is
        gone; its heartbeat goes at its shutdown, which is what the run waits for."""
        self._leaving = True
        log.warning("fleetgen worker %s: run %s is complete and its Redis is closing; "
                    "exiting", rt.worker, run)
        worker_state.should_stop = EX_OK  # Celery's warm shutdown, at its loop's next turn


def take_again(c: Any, name: str) -> None:
    """Celery's `Consumer.add_task_queue` (celery/worker/consumer/consumer.py) for a queue
    this consumer declared at its start, without the declaration again, which waited on
    Valkey on the consumer loop (issue 52). Celery's is:

        if queue in queues:
            q = queues.select_add(queues[queue])
        ...
        if not cset.consuming_from(queue):
            cset.add_queue(q)
            cset.consume()
            info('Started consuming from %s', queue)

    and kombu's `Consumer.add_queue` is `queue = queue(self.channel); if self.auto_declare:
    queue.declare()`: `Queue.declare` -> `Channel.queue_declare`, whose reply counts the
    queue's messages (`queue_declare_ok_t(queue, self._size(queue), 0)`: an LLEN pipeline,
    synchronous), and `queue_bind`, whose `_queue_bind` is an SADD pipeline unless the channel's
    state already has the binding (`if self.state.has_binding(queue, exchange, routing_key):
    return`). The binding lives in the connection's state, in memory, so this consumer's own
    declaration at its start is found here; a queue it never declared is declared as Celery
    would (kept for safety: `HealthGate.start` declares the shared queue)."""
    cset = c.task_consumer
    queues = c.app.amqp.queues
    q = queues.select_add(queues[name])
    if cset.consuming_from(name):
        return
    exchange = q.exchange.name if q.exchange is not None else ""
    declared = cset.channel.state.has_binding(name, exchange or "amq.direct", q.routing_key)
    auto_declare, cset.auto_declare = cset.auto_declare, cset.auto_declare and not declared
    try:
        cset.add_queue(q)
    finally:
        cset.auto_declare = auto_declare
    cset.consume()
    log.info("Started consuming from %s", name)


def silent_s() -> float:
    """How long the engine has answered nothing while this worker's requests time out, 0 while
    it holds no prompt: an idle worker hears nothing, and says nothing against its engine."""
    return round(state.silence.silent_s(), 1) if runtime.in_flight_count() else 0.0
