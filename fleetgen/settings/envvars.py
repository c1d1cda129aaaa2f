"""Every `FLEETGEN_*` environment variable, once: its name, type, default and what it does.

The settings read names and defaults from here (workers/settings.py, the CLI's flag defaults,
the Redis URL, the tokenizer cache); the table of variables in docs/reference.md is generated from
`TABLE` by tools/envvars_table.py, and tests/settings/test_envvars.py fails when the two differ or
when a `FLEETGEN_*` name anywhere in the tree is missing here. An empty value counts as unset
(except where `blank_is_unset` says otherwise). The row type and the docs table are
fleetgen/settings/table.py's, as the run options' are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from fleetgen.errors import ConfigError
from fleetgen.settings.table import Column, Setting, escaped, markdown

T = TypeVar("T")


def _integer(raw: str) -> int:
    # Read as a number first, as the worker settings always have ("5.0" is 5).
    return int(float(raw))


def _flag(raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes")


def _optional_text(raw: str) -> str | None:
    return raw


@dataclass(frozen=True)
class EnvVar(Setting, Generic[T]):
    """A variable: `kind` as docs/reference.md names its type (URL, seconds, integer, 0/1,
    path, text); `read_by`, the commands and processes that read it."""

    default: T
    parse: Callable[[str], T]
    read_by: str
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

    def default_words(self) -> str:
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)


WORKERS = "workers"


def _seconds(name: str, default: float, help: str) -> EnvVar[float]:
    """A duration a worker reads."""
    return EnvVar(name, "seconds", help, default, float, WORKERS)


def _switch(name: str, read_by: str, help: str) -> EnvVar[bool]:
    """0/1, off unless set."""
    return EnvVar(name, "0/1", help, False, _flag, read_by)


def _unset(name: str, kind: str, read_by: str, help: str, shown: str,
           secret: bool = False) -> EnvVar[str | None]:
    """Text with no default value: `shown` says what happens without it."""
    return EnvVar(name, kind, help, None, _optional_text, read_by, default_text=shown,
                  secret=secret)


REDIS_URL = EnvVar(
    "FLEETGEN_REDIS_URL", "URL", "the Redis (≥ 6.2) or Valkey of the runs; `--redis` overrides "
    "it", "redis://127.0.0.1:6379/0", str, "every command, workers", secret=True)
ENGINE_URL = EnvVar(
    "FLEETGEN_ENGINE_URL", "URL", "the worker's own engine server (`fleetgen check` probes it "
    "when set)", "http://127.0.0.1:30000", str, f"{WORKERS}, `check`",
    # An empty URL is a mistake to report (exit 3), not a reason to call localhost.
    blank_is_unset=False)
ENGINE_API_KEY = _unset(
    "FLEETGEN_ENGINE_API_KEY", "text", f"{WORKERS}, `produce`, `doctor`, `check`",
    "sent to the engine as `Authorization: Bearer`", "none", secret=True)
ENGINE_PROTOCOL = _unset(
    "FLEETGEN_ENGINE_PROTOCOL", "protocol name", f"{WORKERS}, `produce`, `doctor`",
    "a registered protocol (fleetgen/engine/kinds.py): `sglang`, SGLang's native `/generate`, "
    "or `openai`, `/v1/completions` (vLLM, llama.cpp, SGLang's `/v1`), or a plug-in's; the "
    "default of `--engine-protocol`", "detected from the server")
ENGINE_KINDS = _unset(
    "FLEETGEN_ENGINE_KINDS", "module[:object],...", f"every command, {WORKERS}",
    "modules that register more engine kinds and protocols, imported at the registry's first "
    "use (docs/engines.md \"Adding an engine kind\")", "the builtin kinds only")
REQUEST_TIMEOUT_S = _seconds("FLEETGEN_REQUEST_TIMEOUT_S", 900.0, "one request to the engine")
MAX_ATTEMPTS = EnvVar("FLEETGEN_MAX_ATTEMPTS", "integer",
                      "attempts per prompt before it is written as a failure", 5, _integer,
                      WORKERS)
BACKOFF_BASE_S = _seconds("FLEETGEN_BACKOFF_BASE_S", 1.0, "the first retry's backoff; it "
                          "doubles with each retry (full jitter)")
BACKOFF_CAP_S = _seconds("FLEETGEN_BACKOFF_CAP_S", 30.0, "the longest backoff")
HEALTH_INTERVAL_S = _seconds("FLEETGEN_HEALTH_INTERVAL_S", 2.0, "how often a worker probes its "
                             "engine's `/ready` and publishes its heartbeat")
ENGINE_GONE_S = _seconds("FLEETGEN_ENGINE_GONE_S", 10.0, "refused or not ready this long = "
                         "gone: the worker stops taking prompts and hands back what it holds")
ENGINE_WAIT_S = _seconds("FLEETGEN_ENGINE_WAIT_S", 600.0, "how long a worker without `-c` waits "
                         "for its engine at start-up; then exit code 4")
# The visibility timeout is a lease, not a bound on a task: every heartbeat renews it on each
# prompt the worker holds (fleetgen/queue/broker.py `QoS.beat`), so a generation of any length
# is never redelivered while its worker lives, and a SIGKILLed worker's prompts come back this
# long after its last beat, plus one sweep. A worker stopped with SIGTERM hands back what it
# still runs after FLEETGEN_HANDBACK_S (workers/handback.py).
VISIBILITY_TIMEOUT_S = _seconds(
    "FLEETGEN_VISIBILITY_TIMEOUT_S", 60.0, "the lease on a held prompt, renewed at every "
    "heartbeat: a SIGKILLed worker's prompts come back this long after its last heartbeat "
    "(plus one sweep, <= 10 s); at least 5 x `FLEETGEN_HEALTH_INTERVAL_S`")
WAIT_AOF = _switch("FLEETGEN_WAIT_AOF", WORKERS,
                   "1: each outcome is durable in the AOF (`WAITAOF`) before its ack")
HANDBACK_S = _seconds("FLEETGEN_HANDBACK_S", 30.0, "a SIGTERMed worker finishes its prompts for "
                      "this long, then hands the rest back")
TASK_LOG = _switch("FLEETGEN_TASK_LOG", WORKERS, "1: Celery's two INFO lines per task "
                   "(received, succeeded) at `-l INFO`; off, failures and retries still log "
                   "their own line with the prompt id")
CACHE_DIR = EnvVar(
    "FLEETGEN_CACHE_DIR", "path", "where the built qwen3.6 tokenizer (`tokenizers/`) and the "
    "tests' llama.cpp model (`llama/`) are cached", Path("~/.cache/fleetgen"), Path,
    "`produce`, `doctor`, tests")
ENGINE_SHARE = _unset(
    "FLEETGEN_ENGINE_SHARE", "I/N", WORKERS, "this worker is the I-th of N processes sharing "
    "one engine: without `-c` it runs its share of the K + 1 threads (docs/cluster.md "
    "\"Several processes per GPU\")", "1/1")
MAX_IN_FLIGHT = EnvVar(
    "FLEETGEN_MAX_IN_FLIGHT", "integer", "the most prompts a worker without `-c` holds against "
    "an engine that reports no slot count (vLLM), which it paces from the engine's queue "
    "(docs/engines.md \"How many requests in flight\"): its thread pool's size", 2048, _integer,
    WORKERS)
SIM_API_KEY = _unset(
    "FLEETGEN_SIM_API_KEY", "text", "`sim`", "the simulator requires `Authorization: Bearer` "
    "with it (the default of `--api-key`)", "none", secret=True)
STATUS_AUTH = _unset("FLEETGEN_STATUS_AUTH", "text", "`status --serve`",
                     "`user:password` of the live page's basic auth", "generated and printed",
                     secret=True)
IMAGE = EnvVar("FLEETGEN_IMAGE", "text", "the image the compose file runs", "fleetgen:latest",
               str, "compose/docker-compose.yml")
CI = _switch("FLEETGEN_CI", "tests",
             "set by `.ci/run`: a test that would skip for a missing system package fails")
LLAMA_SERVER = _unset("FLEETGEN_LLAMA_SERVER", "path", "tests", "a llama.cpp `llama-server` "
                      "build of your own for `tests/real_engines`", "the `engines` extra's")
TEST_VLLM_URL = _unset("FLEETGEN_TEST_VLLM_URL", "URL", "tests", "a vLLM server you started for "
                       "`tests/real_engines/test_vllm.py` (its kill test skips)",
                       "the tier's own server")
TEST_MODULES_DIR = _unset(
    "FLEETGEN_TEST_MODULES_DIR", "directory", "tests",
    "where each process of `tests/e2e/test_run_imports.py` writes the modules it held at exit "
    "(its sitecustomize hook)", "no list written")
TEST_VLLM_SPEC_URL = _unset(
    "FLEETGEN_TEST_VLLM_SPEC_URL", "URL", "tests", "a speculating vLLM server you started for "
    "`tests/real_engines/test_vllm_spec.py` (the flags in `tests/support/vllm.py` SPEC_ARGS)",
    "the module's own server")
BENCH_FIGURES = _unset("FLEETGEN_BENCH_FIGURES", "path", "bench",
                       "where the benches write their figures", "bench/figures")
BENCH_RUN = _unset("FLEETGEN_BENCH_RUN", "text", "bench",
                   "set by `python -m bench`: the run each figure file names",
                   "`python -m bench NAME (alone)`")
# Read by the Slurm script alone (bash), listed here as every variable is.
SLURM_LISTEN_PORT = _unset("FLEETGEN_LISTEN_PORT", "port", "`slurm/fleetgen.sbatch`",
                           "the run's Valkey port on the first node (`run --listen`)",
                           "16000 + the job id modulo 4000")
SLURM_HEAD_ADDR = _unset("FLEETGEN_HEAD_ADDR", "host", "`slurm/fleetgen.sbatch`",
                         "the first node's address as the other nodes reach it",
                         "its `hostname`")

TABLE: tuple[EnvVar[Any], ...] = (
    REDIS_URL, ENGINE_URL, ENGINE_API_KEY, ENGINE_PROTOCOL, ENGINE_KINDS, REQUEST_TIMEOUT_S,
    MAX_ATTEMPTS, BACKOFF_BASE_S, BACKOFF_CAP_S, HEALTH_INTERVAL_S, ENGINE_GONE_S, ENGINE_WAIT_S,
    VISIBILITY_TIMEOUT_S, WAIT_AOF, HANDBACK_S, TASK_LOG, ENGINE_SHARE, MAX_IN_FLIGHT, CACHE_DIR,
    SIM_API_KEY, STATUS_AUTH, IMAGE, CI, LLAMA_SERVER, TEST_VLLM_URL, TEST_VLLM_SPEC_URL,
    TEST_MODULES_DIR,
    BENCH_FIGURES, BENCH_RUN, SLURM_LISTEN_PORT, SLURM_HEAD_ADDR,
)

# docs/reference.md's table (tools/envvars_table.py writes it there).
DOC_COLUMNS: tuple[Column[EnvVar[Any]], ...] = (
    Column("variable", lambda var: f"`{var.name}`"),
    Column("read by", lambda var: var.read_by),
    Column("type", lambda var: escaped(var.kind)),
    Column("default", lambda var: escaped(var.shown_default())),
    Column("what it does", lambda var: var.help + (" (secret: never logged)" if var.secret
                                                   else "")),
)


def doc_table() -> str:
    """TABLE as docs/reference.md shows it."""
    return markdown(DOC_COLUMNS, TABLE)
