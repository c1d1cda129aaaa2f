"""Simulated GPUs: `fleetgen sim` processes that `fleetgen demo`, the benchmarks and the tests
hand a LocalFleet as its servers (`fleetgen run` is given real URLs and never imports this)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from fleetgen.engine.health import probe_url
from fleetgen.local.procs import Child, ProcessGroup, python_argv, wait_for
from fleetgen.settings import envvars
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
class SimGpus:
    """`gpus` simulated GPUs, whose settings default to the simulator's (`SIM`); `start` runs
    them as `fleetgen sim` processes (one for all, or one a GPU named in `gpu_sim_args`) and
    keeps those processes, so one object serves one fleet."""

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
    # Once started: the simulator processes and, per GPU, the port its server reported.
    children: list[Child] = field(default_factory=list, init=False, repr=False)
    ports: list[int] = field(default_factory=list, init=False, repr=False)

    @property
    def worker_env(self) -> dict[str, str]:
        return dict(SIM_WORKER_ENV)

    def flavor(self, gpu: int) -> str:
        """The flavour GPU `gpu`'s simulator speaks (its last --flavor flag; sglang)."""
        args = [*self.sim_args, *self.gpu_sim_args.get(gpu, [])]
        flags = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--flavor"]
        return flags[-1] if flags else "sglang"

    def pool_of(self, gpu: int) -> int | None:
        """The -c of GPU `gpu`'s worker: the simulator's slots, except where it says none, as
        vLLM does not (the worker paces from its queue, as against vLLM)."""
        return None if self.flavor(gpu) == "vllm" else self.max_running_requests

    def flags(self) -> list[str]:
        """The `fleetgen sim` flags of each simulated GPU, `sim_args` last."""
        return ["--context-length", str(self.context_length),
                "--max-running-requests", str(self.max_running_requests),
                "--ttft-ms", str(self.ttft_ms), "--tpot-ms", str(self.tpot_ms),
                # Free prefill unless `sim_args` passes a rate: these fleets run
                # 25-500x faster than a GPU decodes (docs/simulator.md, Prefill).
                "--prefill-tokens-per-s", "inf",
                "--output-tokens-mean", str(self.output_tokens_mean),
                "--seed", str(self.seed), *self.sim_args]

    def engine_cmd(self) -> str:
        """One simulated GPU as an `--engine-cmd` line (`fleetgen demo` starts its simulators
        as `fleetgen run --engine-cmd` starts real servers)."""
        return shlex.join([*python_argv("-m", "fleetgen.simulator"), "--port", "{port}",
                           *self.flags()])

    def argv(self, count: int, extra: list[str]) -> list[str]:
        # Port 0: each server binds a port of the kernel's choosing and reports it in its
        # ready line, so no two fleets (or anything else) can ever be handed the same one.
        return python_argv("-m", "fleetgen.simulator", "--port", "0", "--count", str(count),
                           *self.flags(), *extra)

    def start(self, procs: ProcessGroup, timeout_s: float) -> list[str]:
        """Start the simulators in `procs` and wait until every server is ready; their URLs."""
        if not self.gpu_sim_args:
            self._start_one(procs, "sim", self.gpus, [], timeout_s)
        else:
            for gpu in range(self.gpus):
                self._start_one(procs, f"sim{gpu}", 1, self.gpu_sim_args.get(gpu, []),
                                timeout_s)
        urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        for gpu, url in enumerate(urls):
            # /ready, not /health: SGLang's /health is a generation probe taking >= 1 s.
            wait_for(lambda u=url: probe_url(u).ready, timeout_s,  # type: ignore[misc]
                     f"simulated server gpu{gpu}", check=self.check)
        return urls

    def _start_one(self, procs: ProcessGroup, name: str, count: int, extra: list[str],
                   timeout_s: float) -> None:
        """Start a simulator and take its ports from its own ready line: the ports that
        process bound, so the servers probed afterwards are certainly ours."""
        log_path = procs.log_dir / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        child = procs.start(name, self.argv(count, extra))
        ports: list[int] = []

        def reported() -> bool:
            output = child.log_path.read_bytes()[offset:].decode(errors="replace")
            ports[:] = sim_ports_reported(output)
            return bool(ports)

        wait_for(reported, timeout_s, f"{name}'s ready line", check=lambda: _alive(child))
        if len(ports) != count:
            raise RuntimeError(f"{name} reported {len(ports)} servers, expected {count}")
        self.children.append(child)
        self.ports += ports

    def check(self) -> None:
        """RuntimeError, with its log's end, if a simulator has exited."""
        for child in self.children:
            _alive(child)


def _alive(child: Child) -> None:
    if not child.alive():
        raise RuntimeError(f"simulator exited:\n{child.log_text()[-2000:]}")


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
