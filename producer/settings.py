"""Producer settings: one frozen dataclass, built from flags and FLEETGEN_* in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetgen.base.contract import Sampling
from fleetgen.base.errors import ConfigError
from fleetgen.base.redisconn import redact


@dataclass(frozen=True)
class ProducerSettings:
    input: Path
    run: str
    redis_url: str = field(repr=False)
    tokenizer: str = "qwen3.6"
    context_length: int | None = None
    engine_url: str | None = None
    engine_api_key: str | None = field(default=None, repr=False)
    max_output_tokens: int | None = None
    min_output_tokens: int = 16
    margin: int = 0
    sampling: Sampling = field(default_factory=lambda: Sampling())
    high_water: int | None = None  # None: derived from the live fleet's concurrency
    batch_size: int = 512

    def __post_init__(self) -> None:
        if not self.run or any(c in self.run for c in " :*?/\\"):
            raise ConfigError(f"--run must be a plain name (no spaces, ':', '/', '*'), "
                              f"got {self.run!r}")
        if self.context_length is None and self.engine_url is None:
            raise ConfigError("give --context-length N or --engine-url URL (to read it from "
                              "the server's /v1/models)")
        if self.context_length is not None and self.context_length < 16:
            raise ConfigError(f"--context-length must be at least 16, got {self.context_length}")
        if self.high_water is not None and self.high_water < 1:
            raise ConfigError(f"--high-water must be at least 1, got {self.high_water}")
        if not 1 <= self.batch_size <= 100_000:
            raise ConfigError(f"--batch-size must be in 1..100000, got {self.batch_size}")

    def manifest_settings(self) -> dict[str, Any]:
        """What is stored in the run's manifest: never a secret."""
        return {
            "input": str(self.input.resolve()),
            "tokenizer": self.tokenizer,
            "context_length": self.context_length,
            "engine_url": self.engine_url,
            "max_output_tokens": self.max_output_tokens,
            "min_output_tokens": self.min_output_tokens,
            "margin": self.margin,
            "sampling": dict(self.sampling),
            "redis": redact(self.redis_url),
        }
