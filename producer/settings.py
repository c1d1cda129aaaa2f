"""Producer settings: one frozen dataclass, built from flags and FLEETGEN_* in one place.

A field that is a run option takes its default from its entry in fleetgen/settings/runoptions.py
(`_option`), where its flag, its help and its place in the manifest are declared too."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from fleetgen import engine
from fleetgen.errors import ConfigError
from fleetgen.queue.contract import Sampling
from fleetgen.queue.redisconn import redact
from fleetgen.settings import runoptions
from fleetgen.settings.runoptions import MAX_LOGPROBS
from producer.earlystop import parse_rule

__all__ = ["MAX_LOGPROBS", "MAX_SAMPLES", "MAX_STOPS", "ProducerSettings", "setting_default"]

MAX_SAMPLES = 128  # OpenAI's own limit on `n`
MAX_STOPS = 32  # SGLang 0.5.23 sampling/sampling_params.py MAX_STOP_COUNT: more is a 400


def _option(name: str) -> Any:
    """A field that is run option `name`, with the table's default (an immutable one: the
    empty dicts and `out` are written in the field, and tests/producer/test_settings_defaults.py
    holds them equal to the table's)."""
    return field(default=runoptions.option(name).default)


@dataclass(frozen=True)
class ProducerSettings:
    input: Path
    run: str
    # None in a job that made the run's Redis client itself and passes it down (fleetgen/cli/
    # job.py); `fleetgen produce`, the benchmarks and the tests connect to it.
    redis_url: str | None = field(default=None, repr=False)
    tokenizer: str = _option("tokenizer")
    context_length: int | None = _option("context_length")
    # Every server the run will use (read for their limits; the smallest wins). One URL given
    # as a string is taken as a tuple of one.
    engine_url: tuple[str, ...] = _option("engine_url")
    engine_api_key: str | None = field(default=None, repr=False)
    engine_protocol: str | None = _option("engine_protocol")  # None: detected
    max_output_tokens: int | None = _option("max_output_tokens")
    min_output_tokens: int = _option("min_output_tokens")
    margin: int = _option("margin")
    # Without --engine-url: what the servers count with every input (speculative decoding) and
    # their own input limit; with it, a floor on the reserve and a cap on the input limit.
    reserved_tokens: int = _option("reserved_tokens")
    max_req_input_len: int | None = _option("max_req_input_len")
    sampling: Sampling = field(default_factory=lambda: Sampling())
    n: int = _option("n")  # a row's own `n` wins
    # The share of rows held out (producer/holdout.py): never sent, written to holdout.jsonl.
    holdout: float = _option("holdout")
    logprobs: int = _option("logprobs")
    token_ids: bool = _option("token_ids")
    json_schema: str | None = _option("json_schema")  # the schema as compact JSON
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning: str = _option("reasoning")
    # Early warning (producer/earlystop.py): rules like `truncated>0.2`, judged once `stop_after`
    # answers are back; `ignore_stop` goes on with a run they stopped.
    stop_if: tuple[str, ...] = _option("stop_if")
    stop_after: int = _option("stop_after")
    ignore_stop: bool = _option("ignore_stop")
    high_water: int | None = _option("high_water")  # None: from the live fleet's concurrency
    batch_size: int = _option("batch_size")
    # `last`: regenerate a conversation's last assistant turn; `all`: every turn in order, each
    # built from the answers this run wrote before it, read back from `out` (the drainer's
    # output directory: the files are the truth of what each next turn is built from).
    turns: str = _option("turns")
    out: Path | None = None
    # --turns all: each next turn to the worker that answered the turn before (its server's
    # prefix cache holds the history: producer/affinity.py); off, to the shared queue.
    affinity: bool = _option("affinity")
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
        if not 0 <= self.holdout < 1:
            raise ConfigError(f"--holdout must be a fraction in [0, 1), got {self.holdout}")
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
        """What is stored in the run's manifest (fleetgen/settings/runoptions.py STORED), a secret
        redacted. `files`: the input's files as the producer resolved them (names relative to
        INPUT), so a resume reads the same."""
        stored: dict[str, Any] = {}
        for option in runoptions.STORED:
            if option.name == "files":
                if files is not None:
                    stored["files"] = files
                continue
            stored[option.stored_as] = _stored(getattr(self, option.name), option.secret)
        return stored


def _stored(value: Any, secret: bool) -> Any:
    """A setting as the manifest keeps it (JSON)."""
    if secret:
        return redact(value)
    if isinstance(value, Path):
        return str(value.resolve())
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


def setting_default(name: str) -> Any:
    """The default of ProducerSettings field `name` (a run option's is its table entry's:
    tests/producer/test_settings_defaults.py holds the flags' defaults equal to the fields')."""
    for f in fields(ProducerSettings):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
            raise KeyError(f"ProducerSettings.{name} has no default")
    raise KeyError(f"ProducerSettings has no field {name!r}")
