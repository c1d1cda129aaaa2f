"""Every `FLEETGEN_*` environment variable, once: its name, type, default and what it does.

The settings read names and defaults from here (workers/settings.py, the CLI's flag defaults,
the Redis URL, the tokenizer cache); the table of variables in docs/reference.md is generated from
`TABLE` by tools/envvars_table.py, and tests/base/test_envvars.py fails when the two differ or
when a `FLEETGEN_*` name anywhere in the tree is missing here. An empty value counts as unset
(except where `blank_is_unset` says otherwise).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from fleetgen.base.errors import ConfigError

T = TypeVar("T")


def _seconds(raw: str) -> float:
    return float(raw)


def _integer(raw: str) -> int:
    # Read as a number first, as the worker settings always have ("5.0" is 5).
    return int(float(raw))


def _flag(raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes")


def _optional_text(raw: str) -> str | None:
    return raw


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    name: str
    kind: str  # how docs/reference.md names its type: URL, seconds, integer, 0/1, path, text
    default: T
    parse: Callable[[str], T]
    read_by: str
    help: str
    default_text: str | None = None  # the docs' default where `default` does not say it
    secret: bool = False  # hidden from repr and logs
    blank_is_unset: bool = True

    def given(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable as set in `env` (default: the process environment); None if unset or
        empty."""
        return (os.environ if env is None else env).get(self.name) or None

    def value(self, env: Mapping[str, str] | None = None) -> T:
        """The variable's value in `env` (default: the process environment), parsed; its
        default when unset. ConfigError naming the variable when it does not parse."""
        raw = (os.environ if env is None else env).get(self.name)
        if raw is None or (raw == "" and self.blank_is_unset):
            return self.default
        try:
            return self.parse(raw)
        except ValueError:
            raise ConfigError(f"{self.name} must be a number, got {raw!r}") from None

    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)


WORKERS = "workers"

REDIS_URL: EnvVar[str] = EnvVar(
    "FLEETGEN_REDIS_URL", "URL", "redis://127.0.0.1:6379/0", str, "every command, workers",
    "the Redis (≥ 6.2) or Valkey of the runs; `--redis` overrides it", secret=True)
ENGINE_URL: EnvVar[str] = EnvVar(
    "FLEETGEN_ENGINE_URL", "URL", "http://127.0.0.1:30000", str, f"{WORKERS}, `check`",
    "the worker's own engine server (`fleetgen check` probes it when set)",
    # An empty URL is a mistake to report (exit 3), not a reason to call localhost.
    blank_is_unset=False)
ENGINE_API_KEY: EnvVar[str | None] = EnvVar(
    "FLEETGEN_ENGINE_API_KEY", "text", None, _optional_text,
    f"{WORKERS}, `produce`, `doctor`, `check`",
    "sent to the engine as `Authorization: Bearer`", default_text="none", secret=True)
ENGINE_PROTOCOL: EnvVar[str | None] = EnvVar(
    "FLEETGEN_ENGINE_PROTOCOL", "sglang|openai", None, _optional_text,
    f"{WORKERS}, `produce`, `doctor`",
    "SGLang's native `/generate`, or `/v1/completions` (vLLM, llama.cpp, SGLang's `/v1`); "
    "the default of `--engine-protocol`", default_text="detected from the server")
REQUEST_TIMEOUT_S: EnvVar[float] = EnvVar(
    "FLEETGEN_REQUEST_TIMEOUT_S", "seconds", 900.0, _seconds, WORKERS,
    "one request to the engine")
MAX_ATTEMPTS: EnvVar[int] = EnvVar(
    "FLEETGEN_MAX_ATTEMPTS", "integer", 5, _integer, WORKERS,
    "attempts per prompt before it is written as a failure")
BACKOFF_BASE_S: EnvVar[float] = EnvVar(
    "FLEETGEN_BACKOFF_BASE_S", "seconds", 1.0, _seconds, WORKERS,
    "the first retry's backoff; it doubles with each retry (full jitter)")
BACKOFF_CAP_S: EnvVar[float] = EnvVar(
    "FLEETGEN_BACKOFF_CAP_S", "seconds", 30.0, _seconds, WORKERS, "the longest backoff")
HEALTH_INTERVAL_S: EnvVar[float] = EnvVar(
    "FLEETGEN_HEALTH_INTERVAL_S", "seconds", 2.0, _seconds, WORKERS,
    "how often a worker probes its engine's `/ready` and publishes its heartbeat")
ENGINE_GONE_S: EnvVar[float] = EnvVar(
    "FLEETGEN_ENGINE_GONE_S", "seconds", 10.0, _seconds, WORKERS,
    "refused or not ready this long = gone: the worker stops taking prompts and hands back "
    "what it holds")
ENGINE_WAIT_S: EnvVar[float] = EnvVar(
    "FLEETGEN_ENGINE_WAIT_S", "seconds", 600.0, _seconds, WORKERS,
    "how long a worker without `-c` waits for its engine at start-up; then exit code 4")
# The visibility timeout is a lease, not a bound on a task: every heartbeat renews it on each
# prompt the worker holds (fleetgen/base/broker.py `QoS.renew`), so a generation of any length
# is never redelivered while its worker lives, and a SIGKILLed worker's prompts come back this
# long after its last beat, plus one sweep. A worker stopped with SIGTERM hands back what it
# still runs after FLEETGEN_HANDBACK_S (workers/handback.py).
VISIBILITY_TIMEOUT_S: EnvVar[float] = EnvVar(
    "FLEETGEN_VISIBILITY_TIMEOUT_S", "seconds", 60.0, _seconds, WORKERS,
    "the lease on a held prompt, renewed at every heartbeat: a SIGKILLed worker's prompts "
    "come back this long after its last heartbeat (plus one sweep, <= 10 s); at least 5 x "
    "`FLEETGEN_HEALTH_INTERVAL_S`")
WAIT_AOF: EnvVar[bool] = EnvVar(
    "FLEETGEN_WAIT_AOF", "0/1", False, _flag, WORKERS,
    "1: each outcome is durable in the AOF (`WAITAOF`) before its ack")
HANDBACK_S: EnvVar[float] = EnvVar(
    "FLEETGEN_HANDBACK_S", "seconds", 30.0, _seconds, WORKERS,
    "a SIGTERMed worker finishes its prompts for this long, then hands the rest back")
TASK_LOG: EnvVar[bool] = EnvVar(
    "FLEETGEN_TASK_LOG", "0/1", False, _flag, "workers",
    "1: Celery's two INFO lines per task (received, succeeded) at `-l INFO`; off, failures "
    "and retries still log their own line with the prompt id")
CACHE_DIR: EnvVar[Path] = EnvVar(
    "FLEETGEN_CACHE_DIR", "path", Path("~/.cache/fleetgen"), Path, "`produce`, `doctor`, tests",
    "where the built qwen3.6 tokenizer (`tokenizers/`) and the tests' llama.cpp model "
    "(`llama/`) are cached")
ENGINE_SHARE: EnvVar[str | None] = EnvVar(
    "FLEETGEN_ENGINE_SHARE", "I/N", None, _optional_text, WORKERS,
    "this worker is the I-th of N processes sharing one engine: without `-c` it runs its "
    "share of the K + 1 threads (docs/cluster.md \"Several processes per GPU\")",
    default_text="1/1")
SIM_API_KEY: EnvVar[str | None] = EnvVar(
    "FLEETGEN_SIM_API_KEY", "text", None, _optional_text, "`sim`",
    "the simulator requires `Authorization: Bearer` with it (the default of `--api-key`)",
    default_text="none", secret=True)
STATUS_AUTH: EnvVar[str | None] = EnvVar(
    "FLEETGEN_STATUS_AUTH", "text", None, _optional_text, "`status --serve`",
    "`user:password` of the live page's basic auth", default_text="generated and printed",
    secret=True)
IMAGE: EnvVar[str] = EnvVar(
    "FLEETGEN_IMAGE", "text", "fleetgen:latest", str, "compose/docker-compose.yml",
    "the image the compose file runs")
CI: EnvVar[bool] = EnvVar(
    "FLEETGEN_CI", "0/1", False, _flag, "tests",
    "set by `.ci/run`: a test that would skip for a missing system package fails")
LLAMA_SERVER: EnvVar[str | None] = EnvVar(
    "FLEETGEN_LLAMA_SERVER", "path", None, _optional_text, "tests",
    "a llama.cpp `llama-server` build of your own for `tests/real_engines`",
    default_text="the `engines` extra's")
TEST_VLLM_URL: EnvVar[str | None] = EnvVar(
    "FLEETGEN_TEST_VLLM_URL", "URL", None, _optional_text, "tests",
    "a vLLM server you started for `tests/real_engines/test_vllm.py` (its kill test skips)",
    default_text="the tier's own server")
BENCH_FIGURES: EnvVar[str | None] = EnvVar(
    "FLEETGEN_BENCH_FIGURES", "path", None, _optional_text, "bench",
    "where the benches write their figures", default_text="bench/figures")
BENCH_RUN: EnvVar[str | None] = EnvVar(
    "FLEETGEN_BENCH_RUN", "text", None, _optional_text, "bench",
    "set by `python -m bench`: the run each figure file names",
    default_text="`python -m bench NAME (alone)`")

TABLE: tuple[EnvVar[Any], ...] = (
    REDIS_URL, ENGINE_URL, ENGINE_API_KEY, ENGINE_PROTOCOL, REQUEST_TIMEOUT_S, MAX_ATTEMPTS,
    BACKOFF_BASE_S, BACKOFF_CAP_S, HEALTH_INTERVAL_S, ENGINE_GONE_S, ENGINE_WAIT_S,
    VISIBILITY_TIMEOUT_S, WAIT_AOF, HANDBACK_S, TASK_LOG, ENGINE_SHARE, CACHE_DIR, SIM_API_KEY,
    STATUS_AUTH, IMAGE, CI, LLAMA_SERVER, TEST_VLLM_URL, BENCH_FIGURES, BENCH_RUN,
)
