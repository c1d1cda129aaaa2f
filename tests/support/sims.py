"""Simulated GPUs (SimGpus) started as a user starts `fleetgen sim`: a process of their
own, their ports read from its ready line, for tests that run `fleetgen run` (or `estimate`)
against them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from fleetgen.local.simgpus import SimGpus
from tests.support.simproc import sim_child


@contextmanager
def separate_sims(work: Path, sims: SimGpus, *extra: str, name: str = "sim",
                  count: int | None = None) -> Iterator[list[str]]:
    """`count` (default `sims.gpus`) servers of `sims` in one `fleetgen sim` process, its
    output in NAME.log; yields their URLs."""
    count = sims.gpus if count is None else count
    with sim_child(sims.argv(count, list(extra)), work / f"{name}.log", count) as urls:
        yield urls


def sims_fixture(sims: SimGpus) -> Callable[..., Iterator[list[str]]]:
    """A module's `urls` fixture (`urls = sims_fixture(SIMS)`): its servers, one set a test."""

    @pytest.fixture()
    def urls(tmp_path: Path) -> Iterator[list[str]]:
        with separate_sims(tmp_path, sims) as found:
            yield found

    return urls


def engine_flags(urls: Iterable[str]) -> list[str]:
    """`--engine-url U` for each server, as `fleetgen run` and `estimate` take them."""
    return [a for u in urls for a in ("--engine-url", u)]


def requests_answered(urls: list[str]) -> float:
    """Generation requests the servers have answered, from their /metrics."""
    total = 0.0
    for url in urls:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("fleetgen_sim_requests_total{"):
                total += float(line.rsplit(" ", 1)[1])
    return total
