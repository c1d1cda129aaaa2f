"""A local fleet's simulated GPU is `fleetgen sim` at the simulator's own defaults unless its
SimGpus says otherwise: SimGpus takes its defaults from SimConfig, so the two cannot disagree;
and a fleet's worker takes its -c from its spec, else from its simulated GPU."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from fleetgen.local.fleet import FleetSpec, pool_of
from fleetgen.local.simgpus import SimGpus
from fleetgen.simulator.cli import add_arguments, config_from_args
from fleetgen.simulator.config import SimConfig


def parsed(*argv: str) -> SimConfig:
    """The config `fleetgen sim ARGV` serves with (no server is started)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_a_local_fleets_gpu_is_the_simulator_at_its_defaults() -> None:
    fleet, alone = parsed(*SimGpus().flags()), parsed()
    assert fleet.total_slots == alone.total_slots
    # What a local fleet sets on purpose: free prefill (docs/simulator.md, Prefill), and the
    # slot count passed as a flag, since its workers size their pools from it.
    deliberate = ("prefill_tokens_per_s", "max_running_requests")
    differ = {name: (value, asdict(alone)[name]) for name, value in asdict(fleet).items()
              if name not in deliberate and value != asdict(alone)[name]}
    assert differ == {}


def test_a_spec_that_says_otherwise_is_what_its_simulators_serve() -> None:
    sims = SimGpus(context_length=4096, max_running_requests=8, ttft_ms=5, tpot_ms=0.5,
                   output_tokens_mean=40, seed=7, sim_args=["--flavor", "vllm"])
    config = parsed(*sims.flags())
    assert (config.context_length, config.total_slots, config.ttft_ms, config.tpot_ms,
            config.output_tokens_mean, config.seed, config.flavor) == \
        (4096, 8, 5, 0.5, 40, 7, "vllm")


def test_a_vllm_flavoured_gpu_gets_no_c_as_against_vllm() -> None:
    """vLLM reports no slot count and neither does its flavour: the local fleet must not tell
    the worker the simulator's slots either, so the worker paces from the queue (issue 48)."""
    def pools(spec: FleetSpec, sims: SimGpus) -> list[int | None]:
        return [pool_of(spec, sims, g) for g in range(sims.gpus)]

    vllm = ["--flavor", "vllm"]
    assert pools(FleetSpec(), SimGpus(gpus=3, max_running_requests=12, sim_args=vllm,
                                      gpu_sim_args={2: ["--flavor", "sglang"]})) == \
        [None, None, 12]
    assert pools(FleetSpec(), SimGpus(gpus=1, max_running_requests=12)) == [12]
    assert pools(FleetSpec(concurrency=5), SimGpus(gpus=1, sim_args=vllm)) == [5]
    # Running servers (`fleetgen run`): the worker asks its server unless told.
    assert pool_of(FleetSpec(), None, 0) is None
    assert pool_of(FleetSpec(concurrency=5), None, 0) == 5
