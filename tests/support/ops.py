"""Helpers for the ops tests: the venv's executables, Prometheus scrapes (ports: local.ports)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleetgen.local.flower import start_flower
from fleetgen.local.ports import PortLease, on_leased_port
from fleetgen.local.procs import Child, ProcessGroup

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def venv_env(**extra: str) -> dict[str, str]:
    """The environment of a shell in which `fleetgen`, `celery` and `honcho` are the venv's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETGEN_", "FLOWER_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text -> {(sample name, sorted labels): value}."""
    text = httpx.get(url, timeout=10).text
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def sample(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
           **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def start_flower_leased(procs: ProcessGroup, redis_url: str, credentials: str,
                        timeout_s: float = 60.0) -> tuple[Child, PortLease]:
    """Flower on a leased port (retried on another if taken); close the lease after stopping
    Flower."""
    lease, child = on_leased_port(
        lambda held: start_flower(procs, redis_url, held.port, credentials, timeout_s=timeout_s))
    return child, lease
