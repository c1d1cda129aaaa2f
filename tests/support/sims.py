"""Simulated servers started as a user starts `fleetgen sim`: a process of their own, their
ports read from its ready line, for tests that run `fleetgen run` (or `estimate`) against them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetgen.local.fleet import FleetSpec, LocalFleet, sim_ports_reported
from tests.support.waiting import wait_until


@contextmanager
def separate_sims(work: Path, spec: FleetSpec) -> Iterator[list[str]]:
    """`spec.gpus` servers of `spec` in one `fleetgen sim` process; yields their URLs."""
    fleet = LocalFleet(work / "spec", spec)  # names their flags only; never started
    log = work / "sim.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(fleet.sim_argv(spec.gpus, []), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: len(sim_ports_reported(log.read_text())) == spec.gpus, 60,
                   "the simulators' ready line")
        yield [f"http://127.0.0.1:{p}" for p in sim_ports_reported(log.read_text())]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
