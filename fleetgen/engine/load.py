"""What a server says of its own queue: the requests it runs and those waiting for a slot, read
from its Prometheus `/metrics` under each engine's own gauge names. The worker's pacer
(workers/pacing.py) finds its in-flight limit from them where the server reports no slot count
(vLLM), and every worker shows them beside its limit.

The names, from the engines' sources:
- vLLM 0.32 (v1/metrics/loggers.py `PrometheusStatLogger`): `vllm:num_requests_running`,
  `vllm:num_requests_waiting`, one series per engine core (label `engine`).
- SGLang 0.5.23 (srt/metrics/collector.py `SchedulerMetricsCollector`, with
  `--enable-metrics`): `sglang:num_running_reqs`, `sglang:num_queue_reqs`, one per DP rank.
- llama.cpp's server (with `--metrics`): `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`.
Every series of a name is summed: DP ranks and engine cores share the one URL's queue.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from fleetgen.engine.api import Gauges
from fleetgen.engine.http import server_client

METRICS_PATH = "/metrics"
# `name{labels} value [timestamp]` or `name value`; labels never hold a `}` in these engines.
_SAMPLE = re.compile(r"^(?P<name>[^\s{#]+)(?:\{[^}]*\})?\s+(?P<value>\S+)", re.M)


@dataclass(frozen=True)
class Load:
    """A server's queue at one reading: requests running, and waiting for a slot; and the
    tokens it has generated since it started, where its kind counts them (None: it does not)."""

    running: int
    waiting: int
    generated: float | None = None

    def __add__(self, other: Load) -> Load:
        generated = None if self.generated is None or other.generated is None \
            else self.generated + other.generated
        return Load(self.running + other.running, self.waiting + other.waiting, generated)


def gauges_of(engine: str) -> Gauges | None:
    """The gauges of an engine kind (ServerLimits.engine), as the kind declares them
    (fleetgen/engine/builtin.py for the three above); None for one without."""
    from fleetgen.engine import kinds  # the registry imports `Gauges` from here

    return kinds.gauges_of(engine)


def parse_load(text: str, gauges: Gauges) -> Load | None:
    """The load in a Prometheus text page, or None unless both gauges are in it (the counter
    of generated tokens is None where it is not)."""
    names = (gauges.running, gauges.waiting, gauges.generated)
    sums: dict[str, float] = {}
    for match in _SAMPLE.finditer(text):
        name = match.group("name")
        if name in names:
            try:
                sums[name] = sums.get(name, 0.0) + float(match.group("value"))
            except ValueError:
                continue
    if gauges.running not in sums or gauges.waiting not in sums:
        return None
    generated = sums.get(gauges.generated) if gauges.generated else None
    return Load(round(sums[gauges.running]), round(sums[gauges.waiting]), generated)


class LoadReader:
    """Reads the summed load of one or more servers (a URL, or the servers behind a router)
    with one long-lived client per server; `read` is None when any of them cannot say."""

    def __init__(self, urls: Iterable[str], gauges: Gauges, *, api_key: str | None = None,
                 timeout_s: float = 2.0) -> None:
        self.gauges = gauges
        self._clients = [server_client(url, api_key=api_key, timeout_s=timeout_s)
                         for url in urls]

    def read(self) -> Load | None:
        total = Load(0, 0, 0.0)
        for client in self._clients:
            try:
                response = client.get(METRICS_PATH)
            except httpx.HTTPError:
                return None
            load = parse_load(response.text, self.gauges) if response.status_code == 200 \
                else None
            if load is None:
                return None
            total += load
        return total

    def close(self) -> None:
        for client in self._clients:
            client.close()
