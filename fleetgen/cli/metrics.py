"""`fleetgen metrics`: a Prometheus exporter for fleetgen's counters (rows, tokens, workers).

Serves /metrics for Prometheus: rows done/failed/rejected/truncated, rows written, tokens,
retries, queue depth, rows in flight, and per worker: rows, completion tokens, in flight, engine
health. Values are read from Redis at each scrape, so the exporter can run anywhere that reaches
Redis, as many times as you like. Scrape it next to SGLang's /metrics and Flower's /metrics.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

import redis

from fleetgen import exitcodes
from fleetgen.cli.flags import redis_option, subcommand
from fleetgen.queue.redisconn import redact, redis_url


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "metrics", "serve fleetgen's counters for Prometheus on /metrics",
                   __doc__, run)
    redis_option(p)
    p.add_argument("--port", type=int, default=9108, help="port to serve on (9108)")
    p.add_argument("--bind", default="127.0.0.1", help="address to serve on (127.0.0.1)")
    p.add_argument("--run", action="append", dest="runs", metavar="NAME",
                   help="export this run (repeatable; default: every run in Redis)")


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from fleetgen.monitor.metrics import FleetCollector

    url = redis_url(args.redis)
    registry = CollectorRegistry()
    runs = list(args.runs) if args.runs else None
    # No long retry loop: a scrape during a Redis outage answers fleetgen_up 0 within the
    # scrape timeout instead of hanging.
    client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
    registry.register(FleetCollector(client, (lambda: runs) if runs else None))
    server, _ = start_http_server(args.port, addr=args.bind, registry=registry)
    print(f"fleetgen metrics: serving http://{args.bind}:{args.port}/metrics from "
          f"{redact(url)}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return exitcodes.OK
