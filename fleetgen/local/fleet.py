"""A whole fleet on one machine: embedded Valkey, N simulated SGLang servers, N Celery workers."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import redis

from fleetgen.base import envvars
from fleetgen.base.errors import ConfigError
from fleetgen.engine.health import probe_url
from fleetgen.local.engines import EngineSet
from fleetgen.local.procs import (
    Child,
    ProcessGroup,
    celery_worker_argv,
    dying_with_parent,
    python_argv,
    wait_for,
)
from fleetgen.local.valkey import EmbeddedValkey
from fleetgen.simulator.config import SimConfig

# The simulator's ready line (fleetgen/simulator/cli.py): "serving N server(s) on URL",
# "URL..LAST_PORT" or "URL, URL, ...", then the limits in parentheses.
SIM_READY = re.compile(r"fleetgen sim: serving (\d+) server\(s\) on (.+?) \(context")


# The simulator's own defaults, the one home of what a simulated GPU is unless said otherwise.
SIM = SimConfig()
# A simulator is back (or dead) within a second, not a real server's minutes: its workers
# call it gone after 3 s instead of 10, so a local fleet fails over quickly.
SIM_WORKER_ENV = {envvars.HEALTH_INTERVAL_S.name: "1", envvars.ENGINE_GONE_S.name: "3"}


@dataclass
class FleetSpec:
    """A local fleet: its GPUs (a simulator and a worker each, or real servers), Redis, and
    the simulated GPU's settings, whose defaults are the simulator's (`SIM`)."""

    gpus: int = 8
    context_length: int = SIM.context_length
    # Always passed to the simulators: the workers size their pools from it (-c K).
    max_running_requests: int = SIM.total_slots
    ttft_ms: float = SIM.ttft_ms
    tpot_ms: float = SIM.tpot_ms
    output_tokens_mean: int = SIM.output_tokens_mean
    seed: int = SIM.seed
    sim_args: list[str] = field(default_factory=list)  # extra `fleetgen sim` flags
    # Flags for single GPUs (a half-speed card, a server that dies): GPUs named here get a
    # simulator process of their own; the others share one.
    gpu_sim_args: dict[int, list[str]] = field(default_factory=dict)
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

    def sim_flavor(self, gpu: int) -> str:
        """The flavour GPU `gpu`'s simulator speaks (its last --flavor flag; sglang)."""
        args = [*self.sim_args, *self.gpu_sim_args.get(gpu, [])]
        flags = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--flavor"]
        return flags[-1] if flags else "sglang"

    def pool_of(self, gpu: int) -> int | None:
        """The -c of GPU `gpu`'s worker: `concurrency`, else the simulator's slots, except where
        it says none, as vLLM does not (the worker paces from its queue, as against vLLM)."""
        if self.concurrency:
            return self.concurrency
        return None if self.sim_flavor(gpu) == "vllm" else self.max_running_requests

    def sim_flags(self) -> list[str]:
        """The `fleetgen sim` flags of each simulated GPU, `sim_args` last."""
        return ["--context-length", str(self.context_length),
                "--max-running-requests", str(self.max_running_requests),
                "--ttft-ms", str(self.ttft_ms), "--tpot-ms", str(self.tpot_ms),
                # Free prefill unless `sim_args` passes a rate: these fleets run
                # 25-500x faster than a GPU decodes (docs/simulator.md, Prefill).
                "--prefill-tokens-per-s", "inf",
                "--output-tokens-mean", str(self.output_tokens_mean),
                "--seed", str(self.seed), *self.sim_args]

    def sim_engine_cmd(self) -> str:
        """One simulated GPU as an `--engine-cmd` line (`fleetgen demo` starts its simulators
        as `fleetgen run --engine-cmd` starts real servers)."""
        return shlex.join([*python_argv("-m", "fleetgen.simulator"), "--port", "{port}",
                           *self.sim_flags()])


class LocalFleet:
    def __init__(self, work_dir: Path, spec: FleetSpec, valkey_dir: Path | None = None,
                 engine_urls: list[str] | None = None, valkey_bind: str | None = None,
                 valkey_port: int | None = None) -> None:
        """`valkey_dir`: where the embedded Valkey keeps its AOF (default: in `work_dir`); one
        that outlives the fleet keeps its runs for the next (the demo's resume).
        `engine_urls`: real servers, one worker each (`fleetgen run`), instead of simulated
        GPUs; their workers read their pool size (K + 1) from the server and keep the
        workers' default health settings. `valkey_bind`/`valkey_port`: a Valkey that other
        hosts' workers can join (`fleetgen run --listen`)."""
        self.work_dir = work_dir
        self.engine_urls = list(engine_urls or [])
        self.spec = replace(spec, gpus=len(self.engine_urls)) if self.engine_urls else spec
        self.procs = ProcessGroup(work_dir / "logs")
        self.valkey = EmbeddedValkey(valkey_dir or work_dir / "valkey", port=valkey_port,
                                     password=spec.redis_password, bind=valkey_bind)
        self.sim_ports: list[int] = []  # per GPU, as the simulators reported them
        self.sim: Child | None = None
        self.sims: list[Child] = []  # one per GPU when spec.gpu_sim_args is used
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
        if self.engine_urls:
            return self.engine_urls[gpu]
        return f"http://127.0.0.1:{self.sim_ports[gpu]}"

    def start(self, timeout_s: float = 60.0, say: Callable[[str], None] = print) -> LocalFleet:
        """Valkey, the servers (simulated, started or given) and their workers, in order:
        for tests, benchmarks and `fleetgen node` (`fleetgen run` and the demo go through
        the steps of fleetgen/cli/job.py)."""
        if self.spec.redis_url is None:
            self.valkey.start()
        if self.engines is not None:
            say(f"starting {len(self.engines.engines)} engine(s), logs in "
                f"{self.engines.engines[0].log_path.parent}")
            self.engines.start(say)
            ready = []
            for gpu in self.engines.ready_as_they_come():
                self.start_gpu_workers(gpu)
                ready.append(gpu)
            self.engines_settled(ready)
        else:
            if not self.engine_urls:
                self.start_sims(timeout_s)
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

    def sim_argv(self, count: int, extra: list[str]) -> list[str]:
        # Port 0: each server binds a port of the kernel's choosing and reports it in its
        # ready line, so no two fleets (or anything else) can ever be handed the same one.
        return python_argv("-m", "fleetgen.simulator", "--port", "0", "--count", str(count),
                           *self.spec.sim_flags(), *extra)

    def start_sims(self, timeout_s: float) -> None:
        s = self.spec
        if not s.gpu_sim_args:
            self.sim = self._start_sim("sim", s.gpus, [], timeout_s)
        else:
            for gpu in range(s.gpus):
                child = self._start_sim(f"sim{gpu}", 1, s.gpu_sim_args.get(gpu, []), timeout_s)
                self.sims.append(child)
                self.sim = self.sim or child
        for gpu in range(s.gpus):
            url = self.engine_url(gpu)
            # /ready, not /health: SGLang's /health is a generation probe taking >= 1 s.
            wait_for(lambda u=url: probe_url(u).ready, timeout_s,  # type: ignore[misc]
                     f"simulated server gpu{gpu}", check=self._check_sim)

    def _start_sim(self, name: str, count: int, extra: list[str], timeout_s: float) -> Child:
        """Start a simulator and take its ports from its own ready line: the ports that
        process bound, so the servers probed afterwards are certainly ours."""
        log_path = self.procs.log_dir / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        child = self.procs.start(name, self.sim_argv(count, extra))
        ports: list[int] = []

        def reported() -> bool:
            output = child.log_path.read_bytes()[offset:].decode(errors="replace")
            ports[:] = sim_ports_reported(output)
            return bool(ports)

        def check() -> None:
            if not child.alive():
                raise RuntimeError(f"simulator exited:\n{child.log_text()[-2000:]}")

        wait_for(reported, timeout_s, f"{name}'s ready line", check=check)
        if len(ports) != count:
            raise RuntimeError(f"{name} reported {len(ports)} servers, expected {count}")
        self.sim_ports += ports
        return child

    def _check_sim(self) -> None:
        for sim in self.sims or ([self.sim] if self.sim else []):
            if not sim.alive():
                raise RuntimeError(f"simulator exited:\n{sim.log_text()[-2000:]}")

    def worker_env(self, gpu: int) -> dict[str, str]:
        quick = {} if self.engine_urls else SIM_WORKER_ENV
        return {envvars.REDIS_URL.name: self.redis_url,
                envvars.ENGINE_URL.name: self.engine_url(gpu), **quick, **self.spec.worker_env,
                **self.spec.gpu_worker_env.get(gpu, {})}

    def start_worker(self, gpu: int, name: str | None = None) -> Child:
        # A real server's worker sizes its pool from the server itself (no -c).
        concurrency = self.spec.concurrency if self.engine_urls else self.spec.pool_of(gpu)
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
        total = self.spec.concurrency if self.engine_urls else self.spec.pool_of(gpu)
        started = []
        for i in range(1, count + 1):
            name = self.worker_name(gpu, i)
            env = {**self.worker_env(gpu), envvars.ENGINE_SHARE.name: f"{i}/{count}"}
            share = None if total is None else share_of(total, (i, count))
            started.append(self.procs.start(name, tied(self.spec, celery_worker_argv(
                name, share, self.spec.worker_loglevel, self.spec.task_events)), env=env))
        self.workers += started
        return started

    def worker_name(self, gpu: int, process: int = 1) -> str:
        name = f"gpu{gpu}" if self.spec.processes_per_gpu == 1 else f"gpu{gpu}p{process}"
        return self.spec.worker_prefix + name

    def worker_names(self) -> list[str]:
        return [self.worker_name(g, i) for g in range(self.spec.gpus) if g not in self.skipped
                for i in range(1, self.spec.processes_per_gpu + 1)]

    def wait_workers_ready(self, timeout_s: float, client: redis.Redis | None = None) -> None:
        """A worker is ready once its health gate has published its heartbeat (read on the
        run's client, when the caller has one)."""
        from fleetgen.base.contract import worker_key

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


def tied(spec: FleetSpec, argv: list[str]) -> list[str]:
    return dying_with_parent(argv) if spec.workers_die_with_parent else argv


def _hostname() -> str:
    import socket

    return socket.gethostname()


def sim_ports_reported(output: str) -> list[int]:
    """The ports in a simulator's ready line (empty until it has printed one)."""
    found = SIM_READY.search(output)
    if not found:
        return []
    where = found.group(2)
    if ".." in where:  # consecutive: first URL, then the last port
        first, last = where.rsplit("..", 1)
        start = int(first.rsplit(":", 1)[1])
        return list(range(start, int(last) + 1))
    return [int(url.rsplit(":", 1)[1]) for url in where.split(", ")]
