"""The flags of engines fleetgen starts itself (`fleetgen run --engine-cmd`, `fleetgen node`),
checked into a plan before anything starts: each mistake is one line and exit 3."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from fleetgen.errors import ConfigError
from fleetgen.local.enginecmd import (
    EngineCommand,
    EnginePolicy,
    choose_gpus,
    gpu_groups,
    parse_engine_cmd,
    visible_gpus,
)
from fleetgen.local.engines import EngineSet

POLICY = EnginePolicy()


@dataclass(frozen=True)
class EnginePlan:
    command: EngineCommand
    groups: list[tuple[str, ...]]
    policy: EnginePolicy

    def engine_set(self, log_dir: Path) -> EngineSet:
        return EngineSet(self.command, self.groups, self.policy, log_dir)


def add_engine_options(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--engine-cmd", metavar="CMD", required=required,
                   help="start the engines here: your server's launch line with {port} (and "
                   "{gpu} where wanted), e.g. 'python -m sglang.launch_server --model-path "
                   "/m --port {port}'; one per GPU group, CUDA_VISIBLE_DEVICES set, restarted "
                   "when it dies or hangs, stopped at the end (not with --engine-url)")
    p.add_argument("--gpus", metavar="LIST",
                   help="the GPUs for --engine-cmd, e.g. 0,1,2,3 or 0-3 (default: "
                   "CUDA_VISIBLE_DEVICES, as Slurm sets it, else every /dev/nvidiaN)")
    p.add_argument("--gpus-per-engine", type=int, default=1, metavar="N",
                   help="GPUs per engine, consecutive in --gpus (its --tp) (1)")
    p.add_argument("--engine-start-timeout-s", type=float, default=POLICY.start_timeout_s,
                   metavar="S", help="an engine not ready this long after its start fails "
                   f"(default {POLICY.start_timeout_s:g}: a 27B model's load and CUDA graph "
                   "capture from a slow disk)")
    p.add_argument("--engine-unhealthy-s", type=float, default=POLICY.unhealthy_after_s,
                   metavar="S", help="an engine whose readiness probe fails this long is "
                   f"killed and started again ({POLICY.unhealthy_after_s:g})")
    p.add_argument("--engine-silent-s", type=float, default=POLICY.silent_after_s,
                   metavar="S", help="an engine whose probe passes but whose requests all "
                   "time out (FLEETGEN_REQUEST_TIMEOUT_S), none answered, for S more seconds "
                   f"is killed and started again ({POLICY.silent_after_s:g}); a busy engine "
                   "answers late but answers, and is left alone")
    p.add_argument("--engine-max-failures", type=int, default=POLICY.max_failures,
                   metavar="K", help="an engine that fails K times within "
                   f"{POLICY.window_s:g} s is parked: the run goes on without it "
                   f"({POLICY.max_failures})")


def engine_plan(args: argparse.Namespace) -> EnginePlan | None:
    """None without --engine-cmd; else the checked command, GPU groups and policy. `args` may
    be another command's (estimate runs its sample through `run` with its own flags, which
    have no --engine-cmd)."""
    if getattr(args, "engine_cmd", None) is None:
        if getattr(args, "gpus", None) is not None:
            raise ConfigError("--gpus is for the engines --engine-cmd starts")
        return None
    if getattr(args, "engine_url", None):
        raise ConfigError("--engine-cmd starts the engines, --engine-url names running "
                          "ones: give one of them")
    command = parse_engine_cmd(args.engine_cmd)
    groups = gpu_groups(choose_gpus(args.gpus, visible_gpus()), args.gpus_per_engine)
    policy = EnginePolicy(start_timeout_s=args.engine_start_timeout_s,
                          unhealthy_after_s=args.engine_unhealthy_s,
                          silent_after_s=args.engine_silent_s,
                          max_failures=args.engine_max_failures)
    return EnginePlan(command, groups, policy)
