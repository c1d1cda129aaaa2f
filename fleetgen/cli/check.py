"""`fleetgen check`: a health probe for process managers (Redis, a worker's engine, a heartbeat).

Checks that Redis answers PING; that the engine is ready (GET /ready, else /readiness, else
/health, answering 200; when --engine-url or FLEETGEN_ENGINE_URL is set); and, with --worker,
that the worker's heartbeat is fresh and reports a healthy engine. Prints one line per check;
exits 0 when all pass, 4 otherwise. Made for Docker/compose healthchecks; before a long run, run
`fleetgen doctor`.
"""

from __future__ import annotations

import argparse
import socket
import time
from typing import Any

import redis

from fleetgen import exitcodes
from fleetgen.cli.flags import redis_option, subcommand
from fleetgen.engine import one_engine_url
from fleetgen.engine.preflight import Check, readiness
from fleetgen.queue.contract import worker_key
from fleetgen.queue.redisconn import read_hash, redact, redis_url
from fleetgen.queue.serverclock import server_time
from fleetgen.settings import envvars


def add_parser(sub: Any) -> None:
    p = subcommand(sub, "check", "exit 0 if Redis, the engine and a worker are healthy (for "
                   "healthchecks)", __doc__, run)
    redis_option(p)
    p.add_argument("--engine-url", help="engine base URL (default: $FLEETGEN_ENGINE_URL)")
    p.add_argument("--worker", help="worker node name, e.g. gpu0@%%h (%%h = this host's name)")
    p.add_argument("--max-age-s", type=float, default=30.0,
                   help="oldest acceptable heartbeat in s (30)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="per check (5)")
    p.add_argument("--wait-s", type=float, default=0.0,
                   help="retry until healthy or this many s have passed, e.g. before starting "
                   "a process that needs Redis up (0: check once)")
    p.add_argument("-q", "--quiet", action="store_true", help="print failures only")


def worker_name(pattern: str) -> str:
    """Celery's own `%h` expansion, so `-n gpu0@%h` and `--worker gpu0@%h` agree."""
    return pattern.replace("%h", socket.gethostname())


def check_redis(client: redis.Redis, url: str) -> Check:
    try:
        client.ping()
    except redis.AuthenticationError:
        return Check("redis", False, f"password refused by {redact(url)}")
    except redis.RedisError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Check("redis", False, f"{redact(url)} unreachable ({first})")
    return Check("redis", True, redact(url))


def check_engine(url: str, timeout_s: float) -> Check:
    """The readiness probe (/ready, instant), not SGLang's /health, which generates a token
    and takes at least a second (http_server.py `health_generate`)."""
    return readiness(url, timeout_s, envvars.ENGINE_API_KEY.value())


def check_worker(client: redis.Redis, name: str, max_age_s: float,
                 now: float | None = None) -> Check:
    try:
        beat = read_hash(client, worker_key(name))
    except redis.RedisError:
        return Check(f"worker {name}", False, "cannot read its heartbeat")
    if not beat:
        return Check(f"worker {name}", False, "no heartbeat (not started, or dead long "
                     "enough for its prompts to be back in the queue)")
    age = (now or server_time(client)) - float(beat.get("at", 0))  # the beat's clock
    if age > max_age_s:
        return Check(f"worker {name}", False, f"heartbeat {age:.0f} s old")
    if beat.get("healthy") != "1":
        return Check(f"worker {name}", False,
                     f"reports its engine {beat.get('engine', '?')} unhealthy")
    return Check(f"worker {name}", True,
                 f"heartbeat {age:.1f} s ago, {beat.get('inflight', '?')} in flight, "
                 f"consuming={beat.get('consuming', '?')}")


def run_checks(args: argparse.Namespace, url: str, client: redis.Redis) -> list[Check]:
    checks = [check_redis(client, url)]
    engine = args.engine_url or envvars.ENGINE_URL.given()
    if engine:
        engine = one_engine_url(engine, "--engine-url" if args.engine_url
                                else envvars.ENGINE_URL.name)
        checks.append(check_engine(engine, args.timeout_s))
    if args.worker and checks[0].ok:
        checks.append(check_worker(client, worker_name(args.worker), args.max_age_s))
    return checks


def run(args: argparse.Namespace) -> int:
    url = redis_url(args.redis)
    # No retry policy on the client: a probe answers within its own timeout; --wait-s is the
    # only (explicit) way to ride out a service that is still starting.
    client = redis.Redis.from_url(url, socket_timeout=args.timeout_s,
                                  socket_connect_timeout=args.timeout_s)
    deadline = time.monotonic() + args.wait_s
    checks = run_checks(args, url, client)
    while not all(c.ok for c in checks) and time.monotonic() < deadline:
        time.sleep(0.5)  # a poll interval while waiting for services to come up
        checks = run_checks(args, url, client)
    for c in checks:
        if not (args.quiet and c.ok):
            print(c.line())
    return exitcodes.OK if all(c.ok for c in checks) else exitcodes.UNAVAILABLE
