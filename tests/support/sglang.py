"""A real SGLang 0.5.23 server on this CPU for tests/real_engines/test_sglang.py: its own venv
(`make sglang`, .venv/sglang: tests/support/sglang_cpu/install.sh), the vLLM tier's tiny random
Qwen3 with the Qwen3.6 vocabulary and template (written by transformers in the SGLang venv,
cached as tests/support/vllm.py caches it), and a server on a leased port.

Started as ../shared/notes/sglang-cpu.md found it must be: SGLANG_USE_CPU_ENGINE=1 (else the
scheduler imports vLLM's rotary kernel and dies), `--device cpu --attention-backend
torch_native`, and a token pool of its own size (`--max-total-tokens`; from free memory it took
10 GB for a 2-layer model). One OpenMP thread: the machine has two cores and the tests' fleet
processes share them.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from fleetgen.local.engines import signal_group, wait_group_gone
from fleetgen.local.ports import PortLease
from tests.support.engine_proc import EngineProcess

ROOT = Path(__file__).resolve().parents[2]
SGLANG_VENV = ROOT / ".venv" / "sglang"
SGLANG_PYTHON = SGLANG_VENV / "bin" / "python"
SGLANG_STAMP = SGLANG_VENV / ".installed"
SERVED_NAME = "tiny"
CONTEXT = 4096
# SGLang keeps 6 tokens of a context of 4096 back from the input (its input limit, 4090,
# read by `fleetgen doctor` from the server's own refusal).
INPUT_LIMIT = 4090
MAX_TOTAL_TOKENS = 65536
# What the CPU engine needs in its environment (the notes), and what keeps it off the hub.
ENGINE_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def sglang_python() -> Path | None:
    """The SGLang venv's Python, once `make sglang` finished (its stamp), else None."""
    return SGLANG_PYTHON if SGLANG_STAMP.is_file() and SGLANG_PYTHON.is_file() else None


def launch_args(model: Path, port: str) -> list[str]:
    """`python -m sglang.launch_server`'s flags for the tiny model on this CPU."""
    return ["-m", "sglang.launch_server", "--model-path", str(model),
            "--served-model-name", SERVED_NAME, "--device", "cpu",
            "--attention-backend", "torch_native", "--host", "127.0.0.1", "--port", port,
            "--context-length", str(CONTEXT), "--max-total-tokens", str(MAX_TOTAL_TOKENS),
            "--enable-metrics"]


@dataclass
class SglangServer(EngineProcess):
    """`python -m sglang.launch_server` with its scheduler and detokenizer children, one
    process group of its own."""

    name: ClassVar[str] = "SGLang"
    ready_path: ClassVar[str] = "/health"
    poll_s: ClassVar[float] = 1.0
    # 20-50 s on quiet cores, ~130 s on loaded ones (the notes); more beside a busy suite.
    start_timeout_s: ClassVar[float] = 600.0
    own_session: ClassVar[bool] = True

    python: Path
    model: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    lease: PortLease | None = None
    port: int = 0

    @property
    def argv(self) -> list[str]:
        return [str(self.python), *launch_args(self.model, str(self.port))]

    def env(self) -> dict[str, str]:
        return {**os.environ, **ENGINE_ENV}

    def kill(self) -> None:
        """SIGKILL to the whole group (the server, its scheduler and detokenizer), and a wait
        until every one of them is gone, as fleetgen's own supervisor waits."""
        proc = self.proc
        if proc is not None:
            signal_group(proc.pid, signal.SIGKILL)
            assert wait_group_gone(proc.pid, 60, proc.poll), "SGLang's processes outlived SIGKILL"
            proc.wait()
        self.proc = None
