"""The Celery app of `celery -A workers worker`: FLEETGEN_* settings, one task, a health gate."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, ClassVar

from celery import Celery, bootsteps, signals
from celery.exceptions import Reject

from fleetgen import engine
from fleetgen.base import exitcodes
from fleetgen.base.celeryconf import make_app
from fleetgen.base.contract import QUEUE, TASK_NAME, WORKER_TTL_S, TaskPayload, worker_key
from fleetgen.base.errors import ConfigError, EngineError, EngineGone
from workers import runtime
from workers.generate import generate_one
from workers.settings import WorkerSettings

log = logging.getLogger("fleetgen.worker")

try:
    _settings = WorkerSettings.from_env()
except ConfigError as exc:
    # A misconfigured worker is a user mistake: one line and exit code 3, no traceback.
    print(f"fleetgen worker: {exc}", file=sys.stderr)
    raise SystemExit(exitcodes.CONFIG) from None
app: Celery = make_app(_settings.redis_url, visibility_timeout_s=_settings.visibility_timeout_s,
                       max_connections=512)


@app.task(name=TASK_NAME, bind=True, acks_late=True)
def generate(self: Any, payload: TaskPayload) -> None:
    rt = runtime.get()
    try:
        with runtime.in_flight():
            generate_one(payload, rt.engine, rt.sink, rt.policy, worker=rt.worker)
    except EngineGone as exc:
        # Back to the queue at once, for a GPU whose server is up; the health gate stops
        # this worker from taking more until its own server answers again.
        log.info("id=%s engine gone (%s); prompt handed back", payload["id"], exc)
        raise Reject(str(exc), requeue=True) from exc


@signals.celeryd_init.connect
def _size_pool_from_engine(conf: Any = None, options: Any = None, **_: Any) -> None:
    """Without -c, the pool follows the engine (its protocol's suggested size)."""
    if conf is None or (options or {}).get("concurrency"):
        return
    proto = engine.protocol()
    try:
        limits = proto.read_limits(_settings.engine_url, api_key=_settings.engine_api_key,
                                   timeout_s=5.0)
    except EngineError as exc:
        log.warning("engine %s did not give its slot count (%s); pass -c", _settings.engine_url,
                    exc.message)
        return
    size = proto.pool_size(limits)
    if size:
        conf.worker_concurrency = size
        log.warning("pool sized from the engine: %s running slots -> -c %d",
                    limits.max_running_requests, size)


@signals.worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    concurrency = getattr(sender, "concurrency", None) or 16
    runtime.configure(getattr(sender, "hostname", None) or "worker", int(concurrency))


class HealthGate(bootsteps.StartStopStep):
    """Stops consuming while the local engine is down and resumes when it is back, so a dead
    GPU server does not burn every prompt's retries. Also publishes the worker's heartbeat."""

    requires: ClassVar[set[str]] = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._tref: Any = None
        self._consuming = True

    def start(self, c: Any) -> None:
        interval = runtime.get().settings.health_interval_s
        # Check before the first prompt: a worker started next to an SGLang server that is
        # still loading its weights must not take (and bounce) prompts meanwhile.
        self.check(c)
        self._tref = c.timer.call_repeatedly(interval, self.check, (c,), priority=10)

    def stop(self, c: Any) -> None:
        if self._tref is not None:
            self._tref.cancel()

    def check(self, c: Any) -> None:
        rt = runtime.get()
        healthy = rt.engine.healthy()
        if not healthy and self._consuming:
            log.warning("engine %s unhealthy: %s stops taking prompts", rt.engine.base_url,
                        rt.worker)
            c.cancel_task_queue(QUEUE)
            self._consuming = False
        elif healthy and not self._consuming:
            log.warning("engine %s healthy again: %s takes prompts", rt.engine.base_url,
                        rt.worker)
            c.add_task_queue(QUEUE)
            self._consuming = True
        self._heartbeat(rt, healthy)

    def _heartbeat(self, rt: runtime.Runtime, healthy: bool) -> None:
        key = worker_key(rt.worker)
        try:
            pipe = rt.redis.pipeline()
            pipe.hset(key, mapping={"engine": rt.engine.base_url, "healthy": int(healthy),
                                    "consuming": int(self._consuming), "at": time.time(),
                                    "concurrency": runtime.concurrency(),
                                    "inflight": runtime.in_flight_count()})
            pipe.expire(key, WORKER_TTL_S)
            pipe.execute()
        except Exception:  # a heartbeat must never kill the consumer's timer
            log.debug("heartbeat failed", exc_info=True)


app.steps["consumer"].add(HealthGate)
