"""Local fleets for the tests (Valkey, simulated GPUs, real Celery workers): how the fixtures
start them, what their simulators counted, and Valkey's data copied and restored."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx

from fleetgen.local.fleet import FleetSpec, LocalFleet
from fleetgen.local.simgpus import SimGpus
from fleetgen.local.valkey import EmbeddedValkey

# The type of the chaos tests' `make_fleet` fixture: sim_fleet's fields -> a started fleet.
FleetFactory = Callable[..., LocalFleet]

# Chaos fleets. Requests of ~0.2-0.6 s: long enough that a kill lands mid-run, short enough
# for CI.
CHAOS_SPEC = {"gpus": 3, "context_length": 4096, "max_running_requests": 8, "ttft_ms": 20.0,
              "tpot_ms": 1.0, "output_tokens_mean": 250}

AOF_DIR = "appendonlydir"


SIM_FIELDS = frozenset(f.name for f in fields(SimGpus) if f.init)


def sim_fleet(work_dir: Path, **settings: Any) -> LocalFleet:
    """A fleet (not started) on simulated GPUs: `settings` are SimGpus's fields (gpus, the
    simulators' flags) and FleetSpec's (the workers, Redis), each given to its own."""
    sims = SimGpus(**{k: v for k, v in settings.items() if k in SIM_FIELDS})
    spec = FleetSpec(**{k: v for k, v in settings.items() if k not in SIM_FIELDS})
    return LocalFleet(work_dir, spec, servers=sims)


def sims_of(fleet: LocalFleet) -> SimGpus:
    """The simulated GPUs a sim_fleet was given."""
    assert isinstance(fleet.servers, SimGpus), fleet.servers
    return fleet.servers


def started_fleet(work_dir: Path, **spec: Any) -> Iterator[LocalFleet]:
    """A module fixture's fleet: fast simulated GPUs (8192 context, 16 slots) unless `spec`
    says otherwise, started, and stopped when the module is done."""
    fleet = sim_fleet(work_dir, **{"context_length": 8192, "max_running_requests": 16,
                                   "ttft_ms": 5, "tpot_ms": 0.05, **spec})
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.stop()


def sim_stats(fleet: LocalFleet) -> list[dict[str, Any]]:
    return [httpx.get(fleet.engine_url(g) + "/_sim/stats", timeout=5).json()
            for g in range(fleet.spec.gpus)]


def generated(fleet: LocalFleet) -> int:
    """Completions the simulators served (HTTP 200 on /generate) across the fleet."""
    return sum(int(s["requests_total"].get("200", 0)) for s in sim_stats(fleet))


def written(out: Path) -> int:
    """Result lines the drainer has written so far."""
    path = out / "results.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def copy_data(valkey: EmbeddedValkey, dest: Path) -> Path:
    """A copy of the live AOF, as a lagging replica or a backup holds it: a prefix of the
    writes (a command cut in half at the end is dropped on load: aof-load-truncated)."""
    shutil.copytree(valkey.data_dir / AOF_DIR, dest)
    return dest


def restart_from(valkey: EmbeddedValkey, copy: Path) -> None:
    """Kill Valkey and start it on the same port from the older copy."""
    valkey.kill()
    shutil.rmtree(valkey.data_dir / AOF_DIR)
    shutil.copytree(copy, valkey.data_dir / AOF_DIR)
    valkey.start()
