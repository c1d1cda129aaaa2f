"""Settings of a simulated SGLang fleet: one frozen, validated dataclass."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The SGLang release whose HTTP behaviour the simulator reproduces (docs/simulator.md).
SGLANG_VERSION = "0.5.23"
# Slots a server derives from its memory when --max-running-requests is not given.
DEFAULT_SLOTS = 64
# speculative_hook.py `_handle_eagle_family`: an EAGLE/NEXTN server without
# --max-running-requests resolves it to 48, and /server_info reports that value.
SPECULATIVE_SLOTS = 48
# spec_info.py `SpeculativeAlgorithm` (NEXTN is an alias of EAGLE); the handlers
# `_handle_eagle_family`, `_handle_dflash` and `_handle_ngram` all resolve 48 slots.
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "DFLASH", "NGRAM")
# managers/utils.py `compute_num_reserved_tokens`: only `is_eagle()` keeps drafts in the
# output slots (NEXTN is EAGLE once resolved); DFlash and n-gram reserve nothing.
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN")
# What a server without --speculative-num-draft-tokens resolves it to: DFlash its block size
# (`_handle_dflash`: 16 when the draft model's config does not say), n-gram 12
# (`_handle_ngram`), EAGLE with topk 1 num_steps + 1.
DEFAULT_DRAFT_TOKENS = {"DFLASH": 16, "NGRAM": 12}

# Fault rates are drawn from one uniform number per request, so together they
# must leave room for the requests that are answered normally.
FAULT_RATE_FIELDS = ("error_rate", "queue_full_rate", "hang_rate", "drop_rate")


@dataclass(frozen=True)
class SimConfig:
    """What every simulated server in the fleet looks like and how it misbehaves.

    Times are those of a full-speed GPU; `speed` divides them all. A down window
    `(start_s, end_s)` is measured from the moment the fleet starts listening.
    """

    host: str = "127.0.0.1"
    port: int = 30000  # 0: every server takes its own ephemeral port (tests)
    count: int = 1
    context_length: int = 8192
    max_total_tokens: int | None = None
    # The CLI value: None unless given, as /server_info's top level reports it.
    max_running_requests: int | None = None
    # What a real server would derive from its KV pool: reported only in
    # internal_states, so clients cannot find it at the top level.
    derived_slots: int = DEFAULT_SLOTS
    dp_size: int = 1
    page_size: int = 1
    speculative_algorithm: str | None = None
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    # The share of proposed drafts the verify steps keep (meta_info `spec_accept_rate`), on
    # average over prompts: each prompt's own rate is this moved by up to +/- spread/2 of it,
    # by a hash of the prompt (fleetgen/simulator/spec.py).
    spec_accept_rate: float = 0.6
    spec_accept_spread: float = 0.4
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
    # Which server's OpenAI endpoint to be: "sglang" (every endpoint, SGLang's rules) or
    # "vllm" (only /v1/* and /health, vLLM's length rule and error body).
    flavor: str = "sglang"
    # /health submits a probe and polls it once a second, so it never answers faster.
    health_delay_s: float = 1.0
    max_queued_requests: int | None = None
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
    slowdown: float = 0.0
    speed: float = 1.0
    output_tokens_mean: int = 256
    seed: int = 0
    model_name: str = "fleetgen-sim"
    api_key: str | None = field(default=None, repr=False)
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
    # How long SIGTERM waits for in-flight requests before cutting them off.
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        # Accept a list of pairs (the brief, JSON) but store a hashable tuple.
        windows = tuple((float(a), float(b)) for a, b in self.down_windows)
        object.__setattr__(self, "down_windows", windows)
        self._validate_sizes()
        self._validate_times()
        self._validate_faults()

    def _validate_sizes(self) -> None:
        _require(0 <= self.port <= 65535, "port", "must be in [0, 65535]", self.port)
        _require(1 <= self.count <= 1024, "count", "must be in [1, 1024]", self.count)
        _require(self.flavor in ("sglang", "vllm"), "flavor", "must be sglang or vllm", self.flavor)
        if self.port:
            last = self.port + self.count - 1
            _require(last <= 65535, "count", f"puts the last port at {last}", self.count)
        _require(self.context_length >= 8, "context_length", "must be >= 8", self.context_length)
        if self.max_total_tokens is not None:
            _require(
                self.max_total_tokens >= 8, "max_total_tokens", "must be >= 8",
                self.max_total_tokens,
            )
        if self.max_running_requests is not None:
            _require(
                self.max_running_requests >= self.dp_size, "max_running_requests",
                "must be >= 1 per DP rank", self.max_running_requests,
            )
        _require(self.derived_slots >= 1, "derived_slots", "must be >= 1", self.derived_slots)
        _require(1 <= self.dp_size <= 64, "dp_size", "must be in [1, 64]", self.dp_size)
        _require(1 <= self.page_size <= 256, "page_size", "must be in [1, 256]", self.page_size)
        self._validate_speculative()
        if self.max_queued_requests is not None:
            _require(
                self.max_queued_requests >= 0, "max_queued_requests", "must be >= 0",
                self.max_queued_requests,
            )
        _require(
            self.output_tokens_mean >= 1, "output_tokens_mean", "must be >= 1",
            self.output_tokens_mean,
        )
        _require(
            self.extra_prompt_tokens >= 0, "extra_prompt_tokens", "must be >= 0",
            self.extra_prompt_tokens,
        )
        _require(bool(self.model_name), "model_name", "must not be empty", self.model_name)
        if self.chat_template is not None:
            # A server refuses to start on a template it cannot read; so does the simulator.
            _require(Path(self.chat_template).is_file(), "chat_template",
                     "must name a readable file", self.chat_template)

    def _validate_speculative(self) -> None:
        algorithm = self.speculative_algorithm
        for name in ("spec_accept_rate", "spec_accept_spread"):
            value = getattr(self, name)
            _require(_finite(value) and 0 <= value <= 1, name, "must be in [0, 1]", value)
        if algorithm is None:
            return
        _require(
            algorithm in SPECULATIVE_ALGORITHMS, "speculative_algorithm",
            f"must be one of {', '.join(SPECULATIVE_ALGORITHMS)}", algorithm,
        )
        for name in ("speculative_num_steps", "speculative_eagle_topk",
                     "speculative_num_draft_tokens"):
            _require(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))

    def _validate_times(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "slowdown", "health_delay_s"):
            value = getattr(self, name)
            _require(_finite(value) and value >= 0, name, "must be a number >= 0", value)
        _require(_finite(self.speed) and self.speed > 0, "speed", "must be > 0", self.speed)
        rate = self.prefill_tokens_per_s
        _require(isinstance(rate, int | float) and not math.isnan(rate) and rate > 0,
                 "prefill_tokens_per_s", "must be > 0 (inf: free)", rate)
        _require(self.chunked_prefill_size == -1 or self.chunked_prefill_size >= 1,
                 "chunked_prefill_size", "must be >= 1, or -1 for no chunks",
                 self.chunked_prefill_size)
        _require(
            _finite(self.drain_timeout_s) and self.drain_timeout_s >= 0,
            "drain_timeout_s", "must be >= 0", self.drain_timeout_s,
        )
        if self.die_after_s is not None:
            _require(
                _finite(self.die_after_s) and self.die_after_s >= 0,
                "die_after_s", "must be >= 0", self.die_after_s,
            )
        for start_s, end_s in self.down_windows:
            _require(
                _finite(start_s) and _finite(end_s) and 0 <= start_s < end_s,
                "down_windows", "needs 0 <= start_s < end_s in each window",
                (start_s, end_s),
            )

    def _validate_faults(self) -> None:
        _require(_finite(self.json_invalid_rate) and 0 <= self.json_invalid_rate <= 1,
                 "json_invalid_rate", "must be in [0, 1]", self.json_invalid_rate)
        for name in FAULT_RATE_FIELDS:
            value = getattr(self, name)
            _require(_finite(value) and 0 <= value <= 1, name, "must be in [0, 1]", value)
        total = sum(getattr(self, name) for name in FAULT_RATE_FIELDS)
        _require(
            total <= 1 + 1e-9, "error_rate", "plus queue_full_rate, hang_rate and drop_rate "
            "must not exceed 1", total,
        )

    @property
    def resolved_max_running_requests(self) -> int | None:
        """/server_info's top-level value: the CLI's, or what resolution set (EAGLE: 48)."""
        if self.max_running_requests is None and self.speculative_algorithm is not None:
            return SPECULATIVE_SLOTS
        return self.max_running_requests

    @property
    def reasoning_parser(self) -> str | None:
        """`--reasoning-parser` as /server_info and /model_info report it."""
        return "qwen3" if self.thinking and not self.no_reasoning_parser else None

    @property
    def slots_per_dp(self) -> int:
        """internal_states' effective_max_running_requests_per_dp: the limit in force."""
        resolved = self.resolved_max_running_requests
        if resolved is None:
            return self.derived_slots
        # A real server also caps this by its pool; the simulator's pool is sized
        # from the slots (max_total_num_tokens below), so the CLI value stands.
        return max(1, resolved // self.dp_size)

    @property
    def total_slots(self) -> int:
        return self.slots_per_dp * self.dp_size

    @property
    def num_reserved_tokens(self) -> int:
        """managers/utils.py `compute_num_reserved_tokens`: EAGLE keeps drafts in output slots."""
        if self.speculative_algorithm not in EAGLE_FAMILY:
            return 0
        return max(
            self.speculative_eagle_topk * self.speculative_num_steps,
            self.speculative_num_draft_tokens,
        )

    @property
    def max_total_num_tokens(self) -> int:
        """KV capacity as a server reports it; unset means it never binds before context."""
        if self.max_total_tokens is not None:
            return self.max_total_tokens
        return self.context_length * self.total_slots

    @property
    def max_req_len(self) -> int:
        """Longest prompt + completion the scheduler admits."""
        return min(self.context_length - 1, self.max_total_num_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        """Prompts of this many tokens or more are refused by the scheduler."""
        return self.max_req_len - 5


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _require(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"SimConfig.{name} {rule}, got {value!r}")
