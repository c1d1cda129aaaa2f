"""fleetgen's own counters as Prometheus metrics, read from Redis at every scrape."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgen.monitor import status
from fleetgen.queue import wire
from fleetgen.queue.heartbeat import Heartbeat
from fleetgen.queue.redisconn import read_hash, text
from fleetgen.queue.serverclock import server_time
from fleetgen.runstate.keys import run_keys, runs_index_key

log = logging.getLogger("fleetgen.monitor.metrics")


class FleetCollector(Collector):
    """Nothing is cached: every scrape reads the run's hashes, so the exporter holds no state
    and any number of them can run. `runs` picks the runs; the default is every run in the
    runs index."""

    def __init__(self, client: redis.Redis, runs: Callable[[], Iterable[str]] | None = None,
                 ) -> None:
        self.redis = client
        self._runs = runs or self._indexed_runs

    def _indexed_runs(self) -> list[str]:
        return sorted(text(r) for r in self.redis.smembers(runs_index_key()))

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("fleetgen_up", "1 if the exporter could read Redis")
        try:
            families = self._read()
        except redis.RedisError as exc:
            # A scrape must not fail: report the outage as a value Prometheus can alert on.
            log.warning("cannot read Redis: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _read(self) -> list[Metric]:
        queue = GaugeMetricFamily("fleetgen_queue_depth", "prompts waiting in the Celery "
                                  "queues (the shared one and the workers' own)")
        queue.add_metric([], wire.queued(self.redis))
        metrics: list[Metric] = [queue, *_worker_metrics(status.live_workers(self.redis),
                                                          server_time(self.redis))]
        runs = [s for s in (status.gather(self.redis, r) for r in self._runs()) if s]
        written = {r.run: read_hash(self.redis, run_keys(r.run).written) for r in runs}
        metrics += _run_metrics(runs, written)
        return metrics


def _worker_metrics(beats: dict[str, dict[str, str]], now: float) -> list[Metric]:
    """`now`: Valkey's, the clock the beats are on."""
    healthy = GaugeMetricFamily("fleetgen_worker_healthy",
                                "1 if the worker's engine is up (its readiness probe answers, "
                                "or is slow but connected)", labels=["worker"])
    inflight = GaugeMetricFamily("fleetgen_worker_in_flight",
                                 "prompts the worker is working on (as of its heartbeat)",
                                 labels=["worker"])
    slots = GaugeMetricFamily("fleetgen_worker_concurrency", "the worker's pool size",
                              labels=["worker"])
    lost = GaugeMetricFamily("fleetgen_worker_lost",
                             "1 if the worker's heartbeat lapsed (dead or frozen)",
                             labels=["worker"])
    held = GaugeMetricFamily("fleetgen_worker_held",
                             "prompts the worker holds under its lease (as of its heartbeat)",
                             labels=["worker"])
    back = GaugeMetricFamily("fleetgen_worker_lease_back_in_seconds",
                             "a lost worker: seconds until what it holds is back in the queue",
                             labels=["worker"])
    for name, beat in sorted(beats.items()):
        lease = Heartbeat.of(beat)
        healthy.add_metric([name], int(beat.get("healthy", 0) or 0))
        inflight.add_metric([name], int(beat.get("inflight", 0) or 0))
        slots.add_metric([name], int(beat.get("concurrency", 0) or 0))
        lost.add_metric([name], int(lease.lost(now)))
        held.add_metric([name], lease.held or 0)
        back_in_s = lease.back_in_s(now)
        if lease.lost(now) and back_in_s is not None:
            back.add_metric([name], round(back_in_s, 1))
    return [healthy, inflight, slots, lost, held, back]


def _run_metrics(runs: list[status.RunStatus],
                 written: dict[str, dict[str, str]]) -> list[Metric]:
    rows = CounterMetricFamily("fleetgen_rows", "rows with an outcome, by outcome",
                               labels=["run", "outcome"])
    out = CounterMetricFamily("fleetgen_rows_written", "rows the drainer has written to "
                              "the output files, by outcome", labels=["run", "outcome"])
    truncated = CounterMetricFamily("fleetgen_rows_truncated",
                                    "results that stopped at max_tokens", labels=["run"])
    tokens = CounterMetricFamily("fleetgen_tokens", "tokens of completed rows",
                                 labels=["run", "kind"])
    retries = CounterMetricFamily("fleetgen_retries", "engine calls retried", labels=["run"])
    total = GaugeMetricFamily("fleetgen_run_rows", "rows in the input (once fully read)",
                              labels=["run"])
    inflight = GaugeMetricFamily("fleetgen_run_in_flight",
                                 "rows sent to workers and not finished", labels=["run"])
    per_worker = CounterMetricFamily("fleetgen_worker_rows", "rows finished by each worker",
                                     labels=["run", "worker", "outcome"])
    worker_tokens = CounterMetricFamily("fleetgen_worker_completion_tokens",
                                        "completion tokens by worker", labels=["run", "worker"])
    for s in runs:
        for outcome, value in (("done", s.done), ("failed", s.failed), ("rejected", s.rejected)):
            rows.add_metric([s.run, outcome], value)
            out.add_metric([s.run, outcome], int(written[s.run].get(outcome, 0) or 0))
        truncated.add_metric([s.run], s.truncated)
        tokens.add_metric([s.run, "prompt"], s.prompt_tokens)
        tokens.add_metric([s.run, "completion"], s.completion_tokens)
        retries.add_metric([s.run], s.retries)
        inflight.add_metric([s.run], s.in_flight)
        if s.total is not None:
            total.add_metric([s.run], s.total)
        for w in s.workers:
            if w.done or w.failed:
                per_worker.add_metric([s.run, w.name, "done"], w.done)
                per_worker.add_metric([s.run, w.name, "failed"], w.failed)
                worker_tokens.add_metric([s.run, w.name], w.completion_tokens)
    return [rows, out, truncated, tokens, retries, total, inflight, per_worker, worker_tokens]
