"""What `--engine-cmd` asks for, checked before anything starts (each mistake one line): the
user's launch line with `{port}` (and `{gpu}`), the host's GPUs and their groups; and the
restart policy's arithmetic (backoff, parking), plain functions with plain tests."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fleetgen.errors import ConfigError

PORT = "{port}"
GPU = "{gpu}"
EXAMPLE = ("python -m sglang.launch_server --model-path /models/m --context-length 8192 "
           "--port {port}")
DEVICE_FILE = re.compile(r"nvidia(\d+)$")
# A shell's `NAME=value` before the program: the environment of that one command.
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class EngineCommand:
    """The user's launch line, split as a shell would (no shell runs it: a pipe or `&&` needs
    `bash -c '...'`), with `{port}` and `{gpu}` filled in per engine. Leading `NAME=value`
    words are taken as a shell takes them, the engine's environment (`env`), not its program:
    `SGLANG_USE_CPU_ENGINE=1 python -m sglang.launch_server ...` works as typed. fleetgen's own
    CUDA_VISIBLE_DEVICES (the engine's GPU group) is set after them: the group wins."""

    template: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def program(self) -> str:
        return self.template[0]

    def argv(self, port: int, gpus: Sequence[str]) -> list[str]:
        return [_fill(word, port, gpus) for word in self.template]

    def environment(self, port: int, gpus: Sequence[str]) -> dict[str, str]:
        return {name: _fill(value, port, gpus) for name, value in self.env}


def _fill(word: str, port: int, gpus: Sequence[str]) -> str:
    return word.replace(PORT, str(port)).replace(GPU, ",".join(gpus))


def _split_assignments(words: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    env: list[tuple[str, str]] = []
    while words and ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env.append((name, value))
    return env, words


def parse_engine_cmd(cmd: str, which: Callable[[str], str | None] = shutil.which,
                     ) -> EngineCommand:
    """ConfigError (exit 3) for a line without `{port}`, one that does not split, or whose
    program cannot be found: before any engine, Redis or worker is started."""
    try:
        words = shlex.split(cmd)
    except ValueError as exc:
        raise ConfigError(f"--engine-cmd does not split into words ({exc}): {cmd!r}") from None
    env, words = _split_assignments(words)
    if not words:
        what = "sets variables but names no program" if env else "is empty"
        raise ConfigError(f"--engine-cmd {what}; e.g. --engine-cmd '{EXAMPLE}'")
    if not any(PORT in word for word in words):
        raise ConfigError(f"--engine-cmd must contain {PORT}, where fleetgen puts each "
                          f"engine's port: e.g. --engine-cmd '{EXAMPLE}'")
    program = words[0]
    found = _executable(program) if "/" in program else which(program)
    if not found:
        where = "is not an executable file" if "/" in program else "is not on PATH"
        raise ConfigError(f"--engine-cmd: program {program!r} {where}; give its full path "
                          "or activate the environment that has it")
    return EngineCommand(tuple(words), tuple(env))


def _executable(path: str) -> str | None:
    return path if Path(path).is_file() and os.access(path, os.X_OK) else None


def visible_gpus(environ: Mapping[str, str] = os.environ,
                 dev: Path = Path("/dev")) -> list[str] | None:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES where set (Slurm sets it for its
    allocation), else the host's /dev/nvidiaN; None when neither says anything."""
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip()]
    try:
        found = [m.group(1) for p in dev.iterdir() if (m := DEVICE_FILE.match(p.name))]
    except OSError:
        return None
    return sorted(found, key=int) or None


def parse_gpu_list(value: str) -> list[str]:
    """`0,1,2,3`, `0-3` or a mix (`0-1,4`); GPU UUIDs as they are."""
    gpus: list[str] = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        low, dash, high = part.partition("-")
        if dash and low.isdigit() and high.isdigit():
            if int(high) < int(low):
                raise ConfigError(f"--gpus: range {part!r} runs backwards")
            gpus += [str(g) for g in range(int(low), int(high) + 1)]
        else:
            gpus.append(part)
    if not gpus:
        raise ConfigError(f"--gpus names no GPU: {value!r}")
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        raise ConfigError(f"--gpus names GPU {', '.join(twice)} twice")
    return gpus


def choose_gpus(given: str | None, visible: list[str] | None) -> list[str]:
    """--gpus checked against what the host shows, or all of it by default."""
    if given is None:
        if not visible:
            raise ConfigError("no GPU is visible here (CUDA_VISIBLE_DEVICES unset or empty, "
                              "no /dev/nvidiaN): pass --gpus LIST, or set "
                              "CUDA_VISIBLE_DEVICES=0,1 for engines that need no GPU")
        return list(visible)
    gpus = parse_gpu_list(given)
    if visible is None:
        raise ConfigError(f"--gpus {given}: this host shows no GPU (CUDA_VISIBLE_DEVICES "
                          "unset, no /dev/nvidiaN); set CUDA_VISIBLE_DEVICES to the ones "
                          "the engines may use")
    missing = [g for g in gpus if g not in visible]
    if missing:
        raise ConfigError(f"--gpus names GPU {', '.join(missing)}, which this host does not "
                          f"have (visible: {','.join(visible) or 'none'})")
    return gpus


def gpu_groups(gpus: Sequence[str], per_engine: int) -> list[tuple[str, ...]]:
    """One engine per `per_engine` consecutive GPUs (tensor parallel inside the engine)."""
    if per_engine < 1:
        raise ConfigError(f"--gpus-per-engine must be at least 1, got {per_engine}")
    if len(gpus) % per_engine:
        raise ConfigError(f"--gpus-per-engine {per_engine} does not divide the {len(gpus)} "
                          f"GPU(s) {','.join(gpus)}")
    return [tuple(gpus[i:i + per_engine]) for i in range(0, len(gpus), per_engine)]


@dataclass(frozen=True)
class EnginePolicy:
    """How engines are waited for, watched, restarted and stopped."""

    # A 27B model in bf16 is ~54 GB: minutes to read from a network filesystem, then SGLang's
    # CUDA graph capture (and torch.compile where on) before /ready answers 200. 30 min covers
    # a slow disk; `--engine-start-timeout-s` for more.
    start_timeout_s: float = 1800.0
    # An engine that lives but fails its readiness probe (no answer, 503, refused) this long is
    # killed and started again: a hung NCCL call, a wedged scheduler. Longer than SGLang's own
    # 20 s health-generate window, so one slow batch is not a death.
    unhealthy_after_s: float = 60.0
    # An engine whose probe passes but whose requests all time out, with no answer of any
    # kind, this long (its workers' FLEETGEN_REQUEST_TIMEOUT_S comes first: the first
    # timeout starts the count) is killed and started again: a generate path wedged behind
    # a live HTTP server. A busy server answers late but answers, and every answer ends the
    # count (fleetgen/local/silence.py).
    silent_after_s: float = 60.0
    # Parked (left stopped, the run goes on with the others) at this many failures within
    # `window_s`: an engine that cannot stay up is not restarted forever.
    max_failures: int = 5
    window_s: float = 600.0
    # Restart delays: 1, 2, 4 ... s, at most a minute (a crash loop costs nothing much).
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    # SIGTERM to the engine's process group, SIGKILL after this: under Slurm's KillWait (30 s).
    stop_grace_s: float = 10.0
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("start_timeout_s", "unhealthy_after_s", "silent_after_s", "window_s",
                     "stop_grace_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"engine {name} must be > 0, got {getattr(self, name)}")
        if self.max_failures < 1:
            raise ConfigError(f"engine max_failures must be at least 1, got "
                              f"{self.max_failures}")


def backoff_s(failures: int, policy: EnginePolicy) -> float:
    """The wait before the restart that follows the `failures`-th failure (1-based)."""
    return min(policy.backoff_base_s * 2 ** max(failures - 1, 0), policy.backoff_cap_s)


@dataclass
class FailureWindow:
    """The failures of one engine within the last `window_s`: parked at `max_failures`."""

    policy: EnginePolicy
    times: list[float] = field(default_factory=list)

    def record(self, now: float) -> int:
        """Count a failure at `now`; returns how many fall within the window."""
        self.times = [t for t in self.times if now - t < self.policy.window_s] + [now]
        return len(self.times)

    def parked(self) -> bool:
        return len(self.times) >= self.policy.max_failures
