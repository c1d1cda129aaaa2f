"""`fleetgen sim` in a process of its own, as a user starts it beside `fleetgen run`: on a port of
the kernel's choosing, or on a leased one so that a server stopped and started again (fixed)
keeps its URL, and the same `fleetgen run` command reaches it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetgen.local.simgpus import sim_ports_reported
from tests.support.cli import fleetgen_cli
from tests.support.waiting import wait_until

# Short answers (60 tokens on average) on a 4,096-token context: these runs check what a run
# says, not its speed.
SIM_ARGS = ("--context-length", "4096", "--output-tokens-mean", "60")


@contextmanager
def sim_process(log: Path, *extra: str, port: int = 0, count: int = 1) -> Iterator[list[str]]:
    """`fleetgen sim --port PORT --count COUNT ...`; yields its servers' URLs."""
    with sim_child(fleetgen_cli("sim", "--port", str(port), "--count", str(count), *SIM_ARGS,
                                *extra), log, count) as urls:
        yield urls


@contextmanager
def sim_child(argv: list[str], log: Path, count: int) -> Iterator[list[str]]:
    """The simulator process `argv` (`count` servers), its output in `log`; yields their URLs
    once its ready line names them all, and stops it on the way out."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_until(lambda: len(sim_ports_reported(log.read_text())) == count
                   or proc.poll() is not None, 60, "the simulators' ready line")
        assert proc.poll() is None, log.read_text()[-2000:]
        yield [f"http://127.0.0.1:{p}" for p in sim_ports_reported(log.read_text())]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
