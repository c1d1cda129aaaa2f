"""The engine interface: what a server allows, how to ask it for a completion, its length rule.

Every protocol fleetgen speaks (SGLang's native /generate, OpenAI's /v1/completions) implements
`EngineProtocol`; the producer's budget and the worker's one-shot correction both go through its
`LengthRule`, so an engine's rule is written once, next to the client that talks to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fleetgen.errors import ContextLengthError
from fleetgen.records.outcomes import Generation


@dataclass(frozen=True)
class ServerLimits:
    """What a server reports about itself; None where it does not say."""

    context_length: int
    engine: str = "sglang"  # what answers behind the protocol: sglang, vllm, llama.cpp
    max_total_tokens: int | None = None  # KV capacity, when smaller than the context
    max_running_requests: int | None = None  # requests it runs at once (in force, all DP ranks)
    # Where that number came from (e.g. "internal_states"), for the worker's sizing log line.
    running_requests_from: str | None = None
    dp_size: int = 1  # data-parallel ranks behind the one URL
    model: str | None = None
    max_req_input_len: int | None = None  # the server's own input limit, where it reports one
    reserved_tokens: int = 0  # counted with the input in the length checks (speculative decoding)
    deterministic: bool | None = None  # whether a sampling seed is honoured; None: not reported
    skip_tokenizer_init: bool = False  # the server sends output ids only, no text
    servers_behind: int = 0  # 0: the URL is a server; N: an SGLang router in front of N
    # SGLang's --reasoning-parser (e.g. "qwen3"), None when it has none or does not say: only
    # with one does a JSON schema's grammar wait for `</think>` (`require_reasoning`).
    reasoning_parser: str | None = None


@dataclass(frozen=True)
class GenerateOptions:
    """What a request asks of the engine beyond sampling and budget, from the task payload.
    Each protocol sends them in its engine's own names; one an engine cannot honour is a
    `PermanentError` naming the engine and the way out (docs/formats.md "Thinking, JSON,
    logprobs")."""

    keep_special_tokens: bool = False  # `<think>`/`</think>` stay in the text (the split)
    logprobs: int = 0  # top-K log-probabilities of every output token; 0: none
    json_schema: str | None = None  # a JSON Schema, as a JSON string
    # The answer begins with reasoning that the grammar must let through (SGLang:
    # `require_reasoning`): set with a schema on a thinking model.
    reasoning_first: bool = False
    # The answer's generated token ids must come back (`Generation.output_ids`): SGLang's
    # /generate always sends them; OpenAI-protocol servers are asked (`return_token_ids`).
    token_ids: bool = False


PLAIN = GenerateOptions()


class LengthRule(Protocol):
    """An engine's own length checks, as arithmetic on token counts."""

    def input_limit(self, limits: ServerLimits) -> int:
        """The smallest prompt length (tokens) the engine refuses."""
        ...

    def room(self, prompt_tokens: int, limits: ServerLimits) -> int:
        """The largest max_tokens the engine accepts for this prompt and sends as it is."""
        ...

    @property
    def refuses_excess_budget(self) -> bool:
        """Whether a budget past the room is refused (SGLang) rather than cut (vLLM 0.33,
        llama.cpp): what `doctor` can confirm with a request that must be refused."""
        ...

    def correction(self, error: ContextLengthError, max_tokens: int) -> int | None:
        """The budget the engine's own counts in a context-length 400 allow, or None."""
        ...


class Engine(Protocol):
    """A client of one server, held for a worker's lifetime."""

    @property
    def base_url(self) -> str: ...

    @property
    def rule(self) -> LengthRule:
        """The server's length rule, for the one-shot budget correction."""
        ...

    def generate(self, input_ids: list[int], max_new_tokens: int,
                 sampling: dict[str, Any], rid: str,
                 options: GenerateOptions = PLAIN) -> Generation: ...

    def healthy(self) -> bool:
        """A quick readiness probe (never SGLang's slow /health): True when the server is
        ready, or connected but slow to answer (busy, not gone)."""
        ...

    def close(self) -> None: ...


class EngineProtocol(Protocol):
    """One way of talking to servers: a client, the limits reader, the rule, pool sizing."""

    @property
    def name(self) -> str: ...

    @property
    def rule(self) -> LengthRule:
        """The rule to assume when no server has been read (--context-length alone)."""
        ...

    def rule_for(self, limits: ServerLimits) -> LengthRule:
        """The length rule of the engine that reported these limits."""
        ...

    def connect(self, base_url: str, *, timeout_s: float, concurrency: int,
                api_key: str | None = None) -> Engine: ...

    def read_limits(self, base_url: str, *, api_key: str | None = None,
                    timeout_s: float = 10.0) -> ServerLimits: ...

    def pool_size(self, limits: ServerLimits) -> int | None:
        """Worker threads for this server, or None when it does not say."""
        ...


# The shapes an engine kind's hooks take and give (fleetgen/engine/kinds.py), here so the
# registry imports none of the modules that register kinds.
@dataclass(frozen=True)
class Gauges:
    """One engine kind's two queue gauges, and its counter of generated tokens (the pacer's
    measure of whether more in flight raised the server's output; None: it has none)."""

    running: str
    waiting: str
    generated: str | None = None


@dataclass(frozen=True)
class Check:
    """One line of `check`'s and `doctor`'s report: what was checked, whether it passed, what
    the server answered."""

    name: str
    ok: bool
    detail: str
    # Passes, but the run will miss something the user can turn on: printed as advice.
    note: bool = False

    def line(self) -> str:
        mark = "FAIL" if not self.ok else ("note" if self.note else "ok  ")
        return f"{mark} {self.name}: {self.detail}"


@dataclass(frozen=True)
class ServerRendering:
    prompt_tokens: int
    tokens: list[int] | None  # None: the server gave only a count
    via: str  # the endpoints that were asked


@dataclass(frozen=True)
class Difference:
    position: int  # 0-based index of the first token that differs
    server: list[int]  # SHOWN_TOKENS from there on, each side
    fleetgen: list[int]
    server_text: str  # decoded by fleetgen's tokenizer
    fleetgen_text: str
