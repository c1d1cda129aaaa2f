"""The groups of a simulated server's settings, each with its defaults and its checks:
serving, limits, speculative decoding, server modes, the capacity model and faults."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Slots a server derives from its memory when --max-running-requests is not given.
DEFAULT_SLOTS = 64
# spec_info.py `SpeculativeAlgorithm` (NEXTN is an alias of EAGLE); the handlers
# `_handle_eagle_family`, `_handle_dflash` and `_handle_ngram` all resolve 48 slots.
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "DFLASH", "NGRAM")
# Fault rates are drawn from one uniform number per request, so together they
# must leave room for the requests that are answered normally.
FAULT_RATE_FIELDS = ("error_rate", "queue_full_rate", "hang_rate", "drop_rate")


@dataclass(frozen=True)
class ServingSettings:
    """Where the fleet listens, what it calls its model and who may ask."""

    host: str = "127.0.0.1"
    port: int = 30000  # 0: every server takes its own ephemeral port (tests)
    count: int = 1
    model_name: str = "fleetgen-sim"
    api_key: str | None = field(default=None, repr=False)
    # How long SIGTERM waits for in-flight requests before cutting them off.
    drain_timeout_s: float = 30.0

    def _check_serving(self) -> None:
        require(0 <= self.port <= 65535, "port", "must be in [0, 65535]", self.port)
        require(1 <= self.count <= 1024, "count", "must be in [1, 1024]", self.count)
        if self.port:
            last = self.port + self.count - 1
            require(last <= 65535, "count", f"puts the last port at {last}", self.count)
        require(bool(self.model_name), "model_name", "must not be empty", self.model_name)
        require(finite(self.drain_timeout_s) and self.drain_timeout_s >= 0,
                "drain_timeout_s", "must be >= 0", self.drain_timeout_s)


@dataclass(frozen=True)
class LimitSettings:
    """The sizes SGLang checks requests against: context, KV pool, slots, queue."""

    context_length: int = 8192
    max_total_tokens: int | None = None
    # The CLI value: None unless given, as /server_info's top level reports it.
    max_running_requests: int | None = None
    # What a real server would derive from its KV pool: reported only in
    # internal_states, so clients cannot find it at the top level.
    derived_slots: int = DEFAULT_SLOTS
    dp_size: int = 1
    page_size: int = 1
    max_queued_requests: int | None = None

    def _check_limits(self) -> None:
        require(self.context_length >= 8, "context_length", "must be >= 8", self.context_length)
        at_least("max_total_tokens", self.max_total_tokens, 8)
        if self.max_running_requests is not None:
            require(self.max_running_requests >= self.dp_size, "max_running_requests",
                    "must be >= 1 per DP rank", self.max_running_requests)
        at_least("derived_slots", self.derived_slots, 1)
        require(1 <= self.dp_size <= 64, "dp_size", "must be in [1, 64]", self.dp_size)
        require(1 <= self.page_size <= 256, "page_size", "must be in [1, 256]", self.page_size)
        at_least("max_queued_requests", self.max_queued_requests, 0)


@dataclass(frozen=True)
class SpeculativeSettings:
    """Speculative decoding as SGLang's flags set it, and how well the drafter guesses."""

    speculative_algorithm: str | None = None
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    # The share of proposed drafts the verify steps keep (meta_info `spec_accept_rate`), on
    # average over prompts: each prompt's own rate is this moved by up to +/- spread/2 of it,
    # by a hash of the prompt (fleetgen/simulator/spec.py).
    spec_accept_rate: float = 0.6
    spec_accept_spread: float = 0.4
    # vLLM's `--per-request-spec-decode-metrics` (`--flavor vllm`): "summary" puts each
    # answer's acceptance in its `metrics.speculative_decoding`; "none", vLLM's default,
    # leaves `metrics` null and the /metrics counters as the only report.
    per_request_spec_decode_metrics: str = "none"

    def _check_speculative(self) -> None:
        for name in ("spec_accept_rate", "spec_accept_spread"):
            within(name, getattr(self, name), 0, 1)
        require(self.per_request_spec_decode_metrics in ("none", "summary"),
                "per_request_spec_decode_metrics", "must be none or summary",
                self.per_request_spec_decode_metrics)
        algorithm = self.speculative_algorithm
        if algorithm is None:
            return
        require(algorithm in SPECULATIVE_ALGORITHMS, "speculative_algorithm",
                f"must be one of {', '.join(SPECULATIVE_ALGORITHMS)}", algorithm)
        for name in ("speculative_num_steps", "speculative_eagle_topk",
                     "speculative_num_draft_tokens"):
            at_least(name, getattr(self, name), 1)


@dataclass(frozen=True)
class ModeSettings:
    """Which server the simulator plays and the modes it runs in (SGLang's flags)."""

    enable_deterministic_inference: bool = False
    skip_tokenizer_init: bool = False
    # Model a thinking model (Qwen3's <think> tokens; fleetgen/simulator/answers.py) served with a
    # reasoning parser: answers begin with reasoning unless the prompt switched it off.
    thinking: bool = False
    # With `thinking`: the server runs no `--reasoning-parser` (/server_info `reasoning_parser`
    # null). SGLang then builds no ReasonerGrammarBackend (`create_grammar_backend`), so a
    # grammar applies from the first token even with `require_reasoning`, and meta_info
    # `reasoning_tokens` stays 0 (`ModelConfig.think_end_ids` is set only with a parser).
    no_reasoning_parser: bool = False
    # Truncate a too-long input (and a too-large max_new_tokens) instead of refusing it.
    allow_auto_truncate: bool = False
    # The chat template file the chat endpoints render with (fleetgen/simulator/chat.py);
    # None: Qwen3.6's official one as fleetgen ships it (producer/templates/, read as a file).
    chat_template: str | None = None
    # Which server's OpenAI endpoint to be: "sglang" (every endpoint, SGLang's rules),
    # "vllm" (only /v1/* and /health, vLLM's length rule and error body) or "llama"
    # (llama.cpp's server as fleetgen reads it: fleetgen/simulator/llama.py).
    flavor: str = "sglang"
    # --flavor llama: the server adds `__verbose` when a request says `verbose` (llama.cpp
    # b9754 on); False plays an older build (fleetgen/simulator/llama.py).
    llama_verbose: bool = True
    # /health submits a probe and polls it once a second, so it never answers faster.
    health_delay_s: float = 1.0

    @property
    def reasoning_parser(self) -> str | None:
        """`--reasoning-parser` as /server_info and /model_info report it."""
        return "qwen3" if self.thinking and not self.no_reasoning_parser else None

    def _check_modes(self) -> None:
        require(self.flavor in ("sglang", "vllm", "llama"), "flavor",
                "must be sglang, vllm or llama", self.flavor)
        if self.chat_template is not None:
            # A server refuses to start on a template it cannot read; so does the simulator.
            require(Path(self.chat_template).is_file(), "chat_template",
                    "must name a readable file", self.chat_template)
        not_negative("health_delay_s", self.health_delay_s)


@dataclass(frozen=True)
class CapacitySettings:
    """How fast the simulated GPU works, what its prefix cache keeps, and what it answers."""

    # The fixed part of the time to first token (scheduling, the first step); the prefill of
    # the uncached prompt tokens comes on top of it.
    ttft_ms: float = 50.0
    tpot_ms: float = 5.0
    # Prefill throughput of the GPU (fleetgen/simulator/prefill.py). Infinite: prefill is free,
    # the building block of the protocol tests; `fleetgen sim` defaults to a 27B model on one
    # H100 (docs/simulator.md).
    prefill_tokens_per_s: float = math.inf
    # Tokens per prefill forward pass, as SGLang's flag (8192 on an 80 GB GPU); -1: no chunks.
    chunked_prefill_size: int = 8192
    # Which prefix of a prompt the server can reuse (fleetgen/simulator/prefix_cache.py):
    # "hybrid", Qwen3.6's linear-attention layers (SGLang's Mamba radix cache, vLLM's "align"
    # blocks), or "full", a full-attention model (SGLang's token radix, vLLM's whole blocks).
    prefix_cache: str = "hybrid"
    # SGLang's `--mamba-track-interval`: a decoding hybrid request keeps a state this often.
    mamba_track_interval: int = 256
    # vLLM's `--block-size`; None: its CPU default (128), or 640 for a hybrid model.
    cache_block_size: int | None = None
    # tpot is multiplied by 1 + slowdown x running/K; speed divides every time.
    slowdown: float = 0.0
    speed: float = 1.0
    # The mean natural answer length and the seed of answers and faults.
    output_tokens_mean: int = 256
    seed: int = 0

    def _check_capacity(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "slowdown"):
            not_negative(name, getattr(self, name))
        require(finite(self.speed) and self.speed > 0, "speed", "must be > 0", self.speed)
        rate = self.prefill_tokens_per_s
        require(isinstance(rate, int | float) and not math.isnan(rate) and rate > 0,
                "prefill_tokens_per_s", "must be > 0 (inf: free)", rate)
        require(self.chunked_prefill_size == -1 or self.chunked_prefill_size >= 1,
                "chunked_prefill_size", "must be >= 1, or -1 for no chunks",
                self.chunked_prefill_size)
        require(self.prefix_cache in ("hybrid", "full"), "prefix_cache",
                "must be hybrid or full", self.prefix_cache)
        at_least("cache_block_size", self.cache_block_size, 1)
        at_least("output_tokens_mean", self.output_tokens_mean, 1)


@dataclass(frozen=True)
class FaultSettings:
    """How the servers misbehave: answers that fail, prompts counted long, crashes, downtime.

    A down window `(start_s, end_s)` is measured from the moment the fleet starts listening.
    """

    error_rate: float = 0.0
    queue_full_rate: float = 0.0
    hang_rate: float = 0.0
    drop_rate: float = 0.0
    # Fraction of JSON-schema answers written invalid (deterministic per request), so a run can
    # show its invalid count.
    json_invalid_rate: float = 0.0
    extra_prompt_tokens: int = 0
    die_after_s: float | None = None
    down_windows: Sequence[tuple[float, float]] = ()

    def _check_faults(self) -> None:
        for name in ("json_invalid_rate", *FAULT_RATE_FIELDS):
            within(name, getattr(self, name), 0, 1)
        total = sum(getattr(self, name) for name in FAULT_RATE_FIELDS)
        require(total <= 1 + 1e-9, "error_rate", "plus queue_full_rate, hang_rate and "
                "drop_rate must not exceed 1", total)
        at_least("extra_prompt_tokens", self.extra_prompt_tokens, 0)
        if self.die_after_s is not None:
            require(finite(self.die_after_s) and self.die_after_s >= 0, "die_after_s",
                    "must be >= 0", self.die_after_s)
        for start_s, end_s in self.down_windows:
            require(finite(start_s) and finite(end_s) and 0 <= start_s < end_s,
                    "down_windows", "needs 0 <= start_s < end_s in each window",
                    (start_s, end_s))


def finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def require(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"SimConfig.{name} {rule}, got {value!r}")


def at_least(name: str, value: int | None, low: int) -> None:
    """An integer setting's floor; None (unset) always passes."""
    if value is not None:
        require(value >= low, name, f"must be >= {low}", value)


def not_negative(name: str, value: float) -> None:
    require(finite(value) and value >= 0, name, "must be a number >= 0", value)


def within(name: str, value: float, low: float, high: float) -> None:
    require(finite(value) and low <= value <= high, name, f"must be in [{low}, {high}]", value)
