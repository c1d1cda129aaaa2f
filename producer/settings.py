"""Producer settings: one frozen dataclass, built from flags and FLEETGEN_* in one place."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from fleetgen import engine
from fleetgen.base.contract import Sampling
from fleetgen.base.errors import ConfigError
from fleetgen.base.redisconn import redact
from producer.earlystop import parse_rule

MAX_SAMPLES = 128  # OpenAI's own limit on `n`
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit; vLLM's default max_logprobs is 20
MAX_STOPS = 32  # SGLang 0.5.23 sampling/sampling_params.py MAX_STOP_COUNT: more is a 400


@dataclass(frozen=True)
class ProducerSettings:
    input: Path
    run: str
    redis_url: str = field(repr=False)
    tokenizer: str = "qwen3.6"
    context_length: int | None = None
    # Every server the run will use (read for their limits; the smallest wins). One URL given
    # as a string is taken as a tuple of one.
    engine_url: tuple[str, ...] = ()
    engine_api_key: str | None = field(default=None, repr=False)
    engine_protocol: str | None = None  # sglang | openai; None: detected from the server
    max_output_tokens: int | None = None
    min_output_tokens: int = 16
    margin: int = 0
    # Without --engine-url: what the servers count with every input (speculative decoding) and
    # their own input limit; with it, a floor on the reserve and a cap on the input limit.
    reserved_tokens: int = 0
    max_req_input_len: int | None = None
    sampling: Sampling = field(default_factory=lambda: Sampling())
    n: int = 1  # samples per prompt, each its own request (a row's own `n` wins)
    logprobs: int = 0  # top-K log-probabilities of every output token; 0: none
    token_ids: bool = False  # keep every answer's generated token ids (`output_ids`)
    json_schema: str | None = None  # a JSON Schema document (compact JSON) for every answer
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning: str = "auto"  # auto | split | off: split answers on </think>
    # Early warning (producer/earlystop.py): rules like `truncated>0.2`, judged once `stop_after`
    # answers are back; `ignore_stop` goes on with a run they stopped.
    stop_if: tuple[str, ...] = ()
    stop_after: int = 500
    ignore_stop: bool = False
    high_water: int | None = None  # None: derived from the live fleet's concurrency
    batch_size: int = 512
    # `last`: regenerate a conversation's last assistant turn; `all`: every turn in order, each
    # built from the answers this run wrote before it, read back from `out` (the drainer's
    # output directory: the files are the truth of what each next turn is built from).
    turns: str = "last"
    out: Path | None = None
    # --turns all: each next turn to the worker that answered the turn before (its server's
    # prefix cache holds the history: producer/affinity.py); off, to the shared queue.
    affinity: bool = True
    # How long a next turn may wait in its worker's queue before any worker may take it.
    affinity_wait_s: float = 2.0
    # How the command that runs the producer starts another run instead of this one, for the
    # messages of a resume that does not match (producer/manifest.py NEW_RUN).
    new_run: str = "use a new --run name"

    def __post_init__(self) -> None:
        if isinstance(self.engine_url, str):
            object.__setattr__(self, "engine_url", (self.engine_url,))
        elif self.engine_url is None:
            object.__setattr__(self, "engine_url", ())
        else:
            object.__setattr__(self, "engine_url", tuple(self.engine_url))
        if not self.run or any(c in self.run for c in " :*?/\\"):
            raise ConfigError(f"--run must be a plain name (no spaces, ':', '/', '*'), "
                              f"got {self.run!r}")
        for url in self.engine_url:
            engine.check_url(url)
        if self.context_length is None and not self.engine_url:
            raise ConfigError("give --context-length N or --engine-url URL (to read it from "
                              "the server's /v1/models)")
        if self.context_length is not None and self.context_length < 16:
            raise ConfigError(f"--context-length must be at least 16, got {self.context_length}")
        self._check_length_rule()
        self._check_request_options()
        if self.high_water is not None and self.high_water < 1:
            raise ConfigError(f"--high-water must be at least 1, got {self.high_water}")
        if not 1 <= self.batch_size <= 100_000:
            raise ConfigError(f"--batch-size must be in 1..100000, got {self.batch_size}")
        if self.turns not in ("last", "all"):
            raise ConfigError(f"--turns must be last or all, got {self.turns!r}")
        if self.turns == "all" and self.out is None:
            raise ConfigError("--turns all needs --out DIR, the drainer's output directory: "
                              "each next turn is built from the answers written there")

    def _check_length_rule(self) -> None:
        if self.reserved_tokens < 0:
            raise ConfigError(f"--reserved-tokens must be >= 0, got {self.reserved_tokens}")
        if self.context_length is not None and self.reserved_tokens >= self.context_length:
            raise ConfigError(f"--reserved-tokens {self.reserved_tokens} leaves no room in a "
                              f"{self.context_length}-token context")
        if self.max_req_input_len is not None and self.max_req_input_len < 1:
            raise ConfigError(f"--max-req-input-len must be at least 1, "
                              f"got {self.max_req_input_len}")

    def _check_request_options(self) -> None:
        if not 1 <= self.n <= MAX_SAMPLES:
            raise ConfigError(f"--n must be in 1..{MAX_SAMPLES}, got {self.n}")
        if not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ConfigError(f"--logprobs must be in 0..{MAX_LOGPROBS}, got {self.logprobs}")
        if self.stop_after < 1:
            raise ConfigError(f"--after must be at least 1, got {self.stop_after}")
        for rule in self.stop_if:
            parse_rule(rule)
        if self.reasoning not in ("auto", "split", "off"):
            raise ConfigError(f"--reasoning must be auto, split or off, got {self.reasoning!r}")
        self._check_stops()

    def _check_stops(self) -> None:
        """SGLang 0.5.23 finds every stop string in the text so far (schedule_batch.py
        `_check_str_based_finish`: `stop_str in tail_str`), so an empty one ends every answer
        at its first token; `SamplingParams.normalize` refuses more than MAX_STOP_COUNT."""
        stops = self.sampling.get("stop") or []
        if any(stop == "" for stop in stops):
            raise ConfigError("--stop: an empty stop string would end every answer at its "
                              "first token; give a non-empty one")
        if len(stops) > MAX_STOPS:
            raise ConfigError(f"--stop: at most {MAX_STOPS} stop strings (SGLang's "
                              f"MAX_STOP_COUNT), got {len(stops)}")

    def manifest_settings(self, files: list[str] | None = None) -> dict[str, Any]:
        """What is stored in the run's manifest: never a secret. `files`: the input's files
        as the producer resolved them (names relative to INPUT), so a resume reads the same."""
        return {
            "input": str(self.input.resolve()),
            **({"files": files} if files is not None else {}),
            "tokenizer": self.tokenizer,
            "context_length": self.context_length,
            "engine_url": list(self.engine_url),
            "engine_protocol": self.engine_protocol,
            "max_output_tokens": self.max_output_tokens,
            "min_output_tokens": self.min_output_tokens,
            "margin": self.margin,
            "reserved_tokens": self.reserved_tokens,
            "max_req_input_len": self.max_req_input_len,
            "sampling": dict(self.sampling),
            "n": self.n,
            "logprobs": self.logprobs,
            "token_ids": self.token_ids,
            "json_schema": self.json_schema,
            "chat_template_kwargs": self.chat_template_kwargs,
            "reasoning": self.reasoning,
            "turns": self.turns,
            "redis": redact(self.redis_url),
        }


def setting_default(name: str) -> Any:
    """The default of ProducerSettings field `name`: the CLI's flags take their defaults from
    here, so each is written once (tests/producer/test_settings_defaults.py holds them equal)."""
    for f in fields(ProducerSettings):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
            raise KeyError(f"ProducerSettings.{name} has no default")
    raise KeyError(f"ProducerSettings has no field {name!r}")
