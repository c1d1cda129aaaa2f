"""The Celery app of `celery -A workers worker`: FLEETGEN_* settings, one task, the start-up
checks against the engine, the health gate."""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

import redis
from celery import Celery, signals
from celery.exceptions import Reject

from fleetgen import exitcodes
from fleetgen.errors import ConfigError, EngineError, EngineGone
from fleetgen.queue.celeryconf import make_app
from fleetgen.queue.contract import TASK_NAME, TaskPayload
from workers import runtime, startup
from workers.beat import EventHeartOffLoop
from workers.control import ControlRepliesOffLoop
from workers.events import EventFlushOffLoop
from workers.gate import HealthGate
from workers.generate import generate_one
from workers.handback import RememberConsumer
from workers.pace_step import PaceStep
from workers.pacing import InFlightLimit
from workers.startup import StartupRefused
from workers.state import DEFAULT_CONCURRENCY, state

log = logging.getLogger("fleetgen.worker")

try:
    _settings = runtime.settings()
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
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        # Valkey out of reach past the client's retries before anything was generated (the
        # done bit's read; an outcome's write retries by itself, workers/sink.py): back to the
        # queue, not failed and acked on failure, which left the row nowhere (issue 52).
        log.warning("id=%s: Valkey out of reach (%s); prompt handed back", payload["id"], exc)
        raise Reject(str(exc), requeue=True) from exc


def _refuse(exc: StartupRefused) -> NoReturn:
    # A user-facing start-up failure: one line and a meaningful exit code, no traceback.
    print(f"fleetgen worker: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(exc.code)


@signals.celeryd_init.connect
def _check_engine(conf: Any = None, options: Any = None, **_: Any) -> None:
    """Before the pool exists: refuse an engine the worker cannot use and plan the in-flight
    limit (waiting while the engine loads): -c as given, else the slots the engine reports,
    else paced from its queue with the pool at the ceiling. With -c the engine may come later:
    the health gate keeps the worker idle until it answers."""
    if conf is None:
        return
    fixed = int((options or {}).get("concurrency") or 0)
    try:
        proto = startup.resolve_protocol(_settings, wait=not fixed)
        if proto is None:
            raise EngineError("not answering", None)
        runtime.use_protocol(proto)
        if fixed:
            limits = proto.read_limits(_settings.engine_url, api_key=_settings.engine_api_key,
                                       timeout_s=5.0)
        else:
            limits = startup.wait_for_limits(proto, _settings)
        startup.check_usable(limits, _settings.engine_url)
        reader = startup.queue_reader(limits, _settings)
        plan = startup.fixed_plan(fixed, limits) if fixed else \
            startup.plan_limit(proto, limits, _settings, reader)
    except StartupRefused as exc:
        _refuse(exc)
    except EngineError as exc:  # only with -c: the engine is not there yet
        log.warning("engine %s not answering yet (%s); the health gate waits for it",
                    _settings.engine_url, exc.message)
        return
    conf.worker_concurrency = plan.pool
    state.pacing = InFlightLimit(plan, reader, runtime.in_flight_count)
    log.warning("in-flight limit %d: %s", plan.limit, plan.source)


@signals.after_setup_logger.connect
def _quiet_task_lines(**_: Any) -> None:
    """Celery logs two INFO lines per task (strategy: received; trace: succeeded), each
    formatting the request: at hundreds of prompts a second that is CPU for lines nobody
    reads. Both modules decide once, when their loop is built, whether INFO is on."""
    if not _settings.task_log:
        for name in ("celery.worker.strategy", "celery.app.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)


@signals.worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    concurrency = getattr(sender, "concurrency", None) or DEFAULT_CONCURRENCY
    runtime.configure(getattr(sender, "hostname", None) or "worker", int(concurrency))


app.steps["consumer"].add(HealthGate)
app.steps["consumer"].add(PaceStep)
app.steps["consumer"].add(EventHeartOffLoop)  # Celery's event heartbeat off the loop
app.steps["consumer"].add(EventFlushOffLoop)  # and its task events, when enabled
app.steps["consumer"].add(ControlRepliesOffLoop)  # and its remote-control replies
app.steps["consumer"].add(RememberConsumer)  # and its SIGTERM hand-back (workers/handback.py)
