"""A whole fleet on one machine: embedded Valkey, the servers it is given, a Celery worker each."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import redis

from fleetgen.errors import ConfigError
from fleetgen.local.engines import EngineSet
from fleetgen.local.procs import (
    Child,
    ProcessGroup,
    celery_worker_argv,
    dying_with_parent,
    wait_for,
)
from fleetgen.local.silence import WorkerSilence
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.settings import envvars


class StartedServers(Protocol):
    """Servers the fleet starts as processes of its own before their workers: simulated GPUs
    (fleetgen/local/simgpus.py, for the demo and the tests; `fleetgen run` gets URLs)."""

    gpus: int

    @property
    def worker_env(self) -> dict[str, str]:
        """Their workers' environment (under the spec's own)."""

    def start(self, procs: ProcessGroup, timeout_s: float) -> list[str]:
        """Start them in `procs`; their URLs, one a GPU, once every one is ready."""

    def pool_of(self, gpu: int) -> int | None:
        """GPU `gpu`'s worker's -c (None: the worker asks its server)."""


@dataclass
class FleetSpec:
    """A local fleet's workers and Redis; its GPUs are its servers, one worker each (or
    `processes_per_gpu`), and `gpus` is set from them by LocalFleet."""

    gpus: int = 0
    worker_env: dict[str, str] = field(default_factory=dict)
    # Environment of single GPUs' workers, over worker_env (a skewed clock, tests/chaos).
    gpu_worker_env: dict[int, dict[str, str]] = field(default_factory=dict)
    concurrency: int | None = None  # default: the engine's slot count
    # Worker processes per GPU, sharing its engine and its `concurrency` between them
    # (FLEETGEN_ENGINE_SHARE); named gpu{g}p{i} when more than one.
    processes_per_gpu: int = 1
    worker_loglevel: str = "WARNING"
    task_events: bool = False  # workers send task events from the start (-E): Flower watches
    redis_password: str | None = None
    redis_url: str | None = None  # an existing Redis (e.g. rediss://); else an embedded Valkey
    # Before each worker's name: `fleetgen node` names its workers NODE-gpuN, so two nodes
    # that share a host (and its %h) never share a worker name, its queue or its leases.
    worker_prefix: str = ""
    # Workers get SIGTERM when the command that started them dies, even by SIGKILL (`fleetgen
    # node`, `fleetgen run --engine-cmd`: under Slurm, KillWait's SIGKILL).
    workers_die_with_parent: bool = False


class LocalFleet:
    def __init__(self, work_dir: Path, spec: FleetSpec, valkey_dir: Path | None = None,
                 servers: Sequence[str] | StartedServers = (), valkey_bind: str | None = None,
                 valkey_port: int | None = None) -> None:
        """`valkey_dir`: where the embedded Valkey keeps its AOF (default: in `work_dir`); one
        that outlives the fleet keeps its runs for the next (the demo's resume).
        `servers`: the URLs of running servers (`fleetgen run`), whose workers read their
        pool size (K + 1) from the server and keep the workers' default health settings;
        or servers the fleet starts itself (simulated GPUs); or none, for `with_engines`.
        `valkey_bind`/`valkey_port`: a Valkey that other hosts' workers can join
        (`fleetgen run --listen`)."""
        self.work_dir = work_dir
        # Started ones have URLs once they are up (`start`).
        self.servers = None if isinstance(servers, Sequence) else servers
        self.engine_urls = list(servers) if isinstance(servers, Sequence) else []
        gpus = len(self.engine_urls) if self.servers is None else self.servers.gpus
        self.spec = replace(spec, gpus=gpus)
        self.procs = ProcessGroup(work_dir / "logs")
        self.valkey = EmbeddedValkey(valkey_dir or work_dir / "valkey", port=valkey_port,
                                     password=spec.redis_password, bind=valkey_bind)
        self.workers: list[Child] = []
        # Engines this fleet starts itself (`--engine-cmd`), and the GPUs whose engine
        # failed to start (no worker for them).
        self.engines: EngineSet | None = None
        self.skipped: set[int] = set()

    def with_engines(self, engines: EngineSet) -> LocalFleet:
        """Start these engines too, a GPU's worker once its engine is ready; their URLs are
        the fleet's engine URLs."""
        self.engines = engines
        self.engine_urls = engines.urls
        self.spec = replace(self.spec, gpus=len(self.engine_urls))
        return self

    @property
    def redis_url(self) -> str:
        return self.spec.redis_url or self.valkey.url

    def engine_url(self, gpu: int) -> str:
        return self.engine_urls[gpu]

    def start(self, timeout_s: float = 60.0, say: Callable[[str], None] = print) -> LocalFleet:
        """Valkey, the servers (simulated, started or given) and their workers, in order:
        for tests, benchmarks and `fleetgen node` (`fleetgen run` and the demo go through
        the steps of fleetgen/cli/job.py)."""
        if self.spec.redis_url is None:
            self.valkey.start()
        if self.engines is not None:
            say(f"starting {len(self.engines.engines)} engine(s), logs in "
                f"{self.engines.engines[0].log_path.parent}")
            self.engines.start(say, silence=self.worker_silence(
                redis.Redis.from_url(self.redis_url)))
            ready = []
            for gpu in self.engines.ready_as_they_come():
                self.start_gpu_workers(gpu)
                ready.append(gpu)
            self.engines_settled(ready)
        else:
            if self.servers is not None:
                self.engine_urls = self.servers.start(self.procs, timeout_s)
            for gpu in range(self.spec.gpus):
                self.start_gpu_workers(gpu)
        self.wait_workers_ready(timeout_s)
        return self

    def start_gpu_workers(self, gpu: int) -> None:
        if self.spec.processes_per_gpu == 1:
            self.start_worker(gpu)
        else:
            self.start_shared_workers(gpu)

    def engines_settled(self, ready: list[int]) -> None:
        """Every started engine is ready or has failed to start: the failed ones get no
        worker. ConfigError (exit 3) when none started."""
        assert self.engines is not None
        self.skipped = set(range(self.spec.gpus)) - set(ready)
        if not ready:
            first = self.engines.engines[0]
            raise ConfigError(f"no engine started ({first.name}: {first.error}); each one's "
                              f"log is in {first.log_path.parent}")

    def serving_urls(self) -> list[str]:
        """The engine URLs the run's producer reads its limits from: all but failed ones."""
        return [url for gpu, url in enumerate(self.engine_urls) if gpu not in self.skipped]

    def stop_processes(self, grace_s: float) -> None:
        """At a run's end the workers first (nothing is sent to an engine going away), then
        the engines; stopped by a signal (a short `grace_s`, gone in 2 s), all at once."""
        hurry = grace_s < 1.0
        if self.engines is not None and hurry:
            self.engines.begin_stop(grace_s)
        self.procs.stop_all(grace_s=grace_s)
        if self.engines is not None:
            self.engines.stop(grace_s if hurry else None)

    def worker_env(self, gpu: int) -> dict[str, str]:
        quick = {} if self.servers is None else self.servers.worker_env
        return {envvars.REDIS_URL.name: self.redis_url,
                envvars.ENGINE_URL.name: self.engine_url(gpu), **quick, **self.spec.worker_env,
                **self.spec.gpu_worker_env.get(gpu, {})}

    def start_worker(self, gpu: int, name: str | None = None) -> Child:
        concurrency = self.pool_of(gpu)
        argv = celery_worker_argv(self.worker_name(gpu), concurrency, self.spec.worker_loglevel,
                                  self.spec.task_events)
        child = self.procs.start(name or self.worker_name(gpu), tied(self.spec, argv),
                                 env=self.worker_env(gpu))
        if gpu < len(self.workers):
            self.workers[gpu] = child
        else:
            self.workers.append(child)
        return child

    def start_shared_workers(self, gpu: int) -> list[Child]:
        """spec.processes_per_gpu workers on one engine, each with its share of the pool."""
        from workers.startup import share_of

        count = self.spec.processes_per_gpu
        total = self.pool_of(gpu)
        started = []
        for i in range(1, count + 1):
            name = self.worker_name(gpu, i)
            env = {**self.worker_env(gpu), envvars.ENGINE_SHARE.name: f"{i}/{count}"}
            share = None if total is None else share_of(total, (i, count))
            started.append(self.procs.start(name, tied(self.spec, celery_worker_argv(
                name, share, self.spec.worker_loglevel, self.spec.task_events)), env=env))
        self.workers += started
        return started

    def pool_of(self, gpu: int) -> int | None:
        return pool_of(self.spec, self.servers, gpu)

    def worker_name(self, gpu: int, process: int = 1) -> str:
        name = f"gpu{gpu}" if self.spec.processes_per_gpu == 1 else f"gpu{gpu}p{process}"
        return self.spec.worker_prefix + name

    def worker_silence(self, client: redis.Redis) -> WorkerSilence:
        """What the workers on each started engine say of its silence (their heartbeats, on
        `client`): the supervisor's evidence of an engine that hangs with its probe passing."""
        def workers_of(gpu: int) -> list[str]:
            return [f"{self.worker_name(gpu, i)}@{_hostname()}"
                    for i in range(1, self.spec.processes_per_gpu + 1)]

        return WorkerSilence(client, workers_of)

    def worker_names(self) -> list[str]:
        return [self.worker_name(g, i) for g in range(self.spec.gpus) if g not in self.skipped
                for i in range(1, self.spec.processes_per_gpu + 1)]

    def wait_workers_ready(self, timeout_s: float, client: redis.Redis | None = None) -> None:
        """A worker is ready once its health gate has published its heartbeat (read on the
        run's client, when the caller has one)."""
        from fleetgen.queue.contract import worker_key

        client = client or redis.Redis.from_url(self.redis_url)

        def ready() -> bool:
            names = self.worker_names()
            return sum(client.exists(worker_key(f"{n}@" + _hostname()))
                       for n in names) == len(names)

        def check() -> None:
            for w in self.workers:
                if not w.alive():
                    raise RuntimeError(f"worker {w.name} exited:\n{w.log_text()[-3000:]}")

        wait_for(ready, timeout_s, "workers to come online", poll_s=0.2, check=check)

    def stop(self) -> None:
        self.stop_processes(grace_s=15.0)
        self.valkey.stop()


def pool_of(spec: FleetSpec, servers: StartedServers | None, gpu: int) -> int | None:
    """GPU `gpu`'s worker's -c: the spec's `concurrency`, else what started servers say; a
    running server's worker sizes its pool from the server itself (None: no -c)."""
    if spec.concurrency or servers is None:
        return spec.concurrency
    return servers.pool_of(gpu)


def tied(spec: FleetSpec, argv: list[str]) -> list[str]:
    return dying_with_parent(argv) if spec.workers_die_with_parent else argv


def _hostname() -> str:
    import socket

    return socket.gethostname()

