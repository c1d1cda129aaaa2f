"""The Celery configuration that producer and workers share: JSON only, late acks, no results."""

from __future__ import annotations

from typing import Any

from celery import Celery

from fleetgen.queue.broker import TRANSPORT, use_orjson_decoder
from fleetgen.queue.contract import QUEUE, TASK_NAME
from fleetgen.queue.redisconn import keepalive_options


def celery_config(
    redis_url: str, *, visibility_timeout_s: float, max_connections: int = 64
) -> dict[str, Any]:
    transport = {
        "visibility_timeout": visibility_timeout_s,
        "max_connections": max_connections,
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive_options(),  # a dead link found in ~30 s, not 2 h
        "health_check_interval": 15,
        "socket_connect_timeout": 10,
        "socket_timeout": 30,
        "retry_on_timeout": True,
        # Sweep for abandoned (SIGKILLed) messages often enough that a small visibility
        # timeout means a quick redelivery: every min(10 s, timeout / 10), no throttling.
        "unacked_restore_interval": sweep_interval_s(visibility_timeout_s),
        "unacked_restore_throttle": 1,
        # Every sweep runs under a Redis lock that expires after `unacked_mutex_expire` (kombu
        # 5.7 transport/redis.py `QoS.restore_visible` -> `Mutex`, default 300 s). A worker
        # SIGKILLed inside a sweep leaves the lock held, and no worker restores anything until
        # it expires; the lock is not what makes a restore safe (`QoS.restore_by_tag` is a
        # WATCH transaction on the unacked hash, so two sweeps never restore a message twice).
        "unacked_mutex_expire": mutex_expire_s(visibility_timeout_s),
    }
    return {
        "broker_url": redis_url,
        # kombu's Redis transport with one client per channel (fleetgen/queue/broker.py); the
        # URL still says redis://, rediss:// or unix://, and kombu reads it as before.
        "broker_transport": TRANSPORT,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "broker_pool_limit": max_connections,
        # JSON only: pickle executes code on load.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # Outcomes go to the run's stream, never to a result backend.
        "result_backend": None,
        "task_ignore_result": True,
        "task_store_errors_even_if_ignored": False,
        # Late ack + prefetch 1: a worker holds exactly `concurrency` prompts, and a killed
        # worker's prompts are redelivered.
        "task_acks_late": True,
        "worker_prefetch_multiplier": 1,
        "task_acks_on_failure_or_timeout": True,
        "task_reject_on_worker_lost": False,
        "task_default_queue": QUEUE,
        "task_routes": {TASK_NAME: {"queue": QUEUE}},
        "task_create_missing_queues": True,
        # A stopped worker requeues what it holds instead of leaving it to the timeout.
        "worker_soft_shutdown_timeout": 30.0,
        "worker_enable_soft_shutdown_on_idle": True,
        # After a Redis blip, don't keep running prompts that will be redelivered anyway.
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # Task events cost a worker about a sixth of its CPU per prompt (an event per
        # received/started/succeeded, and a Redis publish per flush) and nothing in fleetgen
        # reads them: `status`, `metrics` and the health gate use the run's counters and the
        # worker heartbeat key. Flower turns them on by itself while it runs (its
        # `enable_events` broadcast, every 5 s, which the worker's heartbeat dispatcher
        # accepts); `celery worker -E` turns them on from the start.
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "broker_channel_error_retry": True,
    }


def sweep_interval_s(visibility_timeout_s: float) -> int:
    """Seconds between two sweeps of a worker for messages whose lease has lapsed."""
    return max(1, min(10, int(visibility_timeout_s // 10)))


def mutex_expire_s(visibility_timeout_s: float) -> int:
    """Half the visibility timeout, within [5 s, kombu's 300 s]: a dead sweeper then delays a
    redelivery by at most half of what the timeout itself already waits."""
    return int(max(5, min(300, visibility_timeout_s // 2)))


def make_app(redis_url: str, *, visibility_timeout_s: float, max_connections: int = 64) -> Celery:
    use_orjson_decoder()  # kombu's registry is the process's: every app here decodes so
    app = Celery("fleetgen", set_as_current=False)
    app.conf.update(
        celery_config(
            redis_url, visibility_timeout_s=visibility_timeout_s, max_connections=max_connections
        )
    )
    # Celery's app-level copy of the timeout (used by its own redis bits) must match.
    app.conf.visibility_timeout = visibility_timeout_s
    return app
