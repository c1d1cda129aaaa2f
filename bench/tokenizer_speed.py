"""Measure prompts/s of the ways to render and tokenize chat prompts with the Qwen3.6 tokenizer.

Run from the repository root: `python -m bench.tokenizer_speed [--rows N] [--cache-dir DIR]`.
It decided producer.tokenizer's fast path (tiktoken per text, compiled jinja template).
"""

from __future__ import annotations

import argparse
import random
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from bench.common import chat_row, self_cpu_s
from producer import qwen_build
from producer.tokenizer import QwenTokenizer, load_tokenizer, qwen_tiktoken_encoding


def make_rows(count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """`count` system+user chats of about 300 tokens each, deterministic (the producer
    bench's rows)."""
    rng = random.Random(seed)
    return [chat_row(i, 220, rng)["messages"] for i in range(count)]


def rate(label: str, count: int, fn: Callable[[], Any], repeat: int = 3) -> Any:
    """Print the best of `repeat` runs as items/s (best: other processes share the cores)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    print(f"{label:<52} {count / best:>10,.0f} prompts/s")
    return result


def load_times(path: Path) -> None:
    """CPU seconds of loading the cached tokenizer the way producer/qwen_build.py does and the
    way it did before (transformers' from_pretrained, base64.b64decode of the ranks), best of
    3 each, in this process (transformers already imported)."""
    import base64

    from transformers import PreTrainedTokenizerFast

    def old() -> None:
        PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        lines = qwen_build.QWEN_VOCAB_FILE.read_bytes().splitlines()
        ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in lines if line)}
        assert len(ranks) == len(qwen_build.qwen_ranks())

    def new() -> None:
        qwen_build._loaded.clear()
        qwen_build.qwen_ranks.cache_clear()
        assert qwen_build.load_cached(path) is not None
        qwen_build.qwen_ranks()

    best = {}
    for name, fn in (("from_pretrained + b64decode (before)", old), ("load_cached (ours)", new)):
        runs = []
        for _ in range(3):
            start = self_cpu_s()
            fn()
            runs.append(self_cpu_s() - start)
        best[name] = min(runs)
        print(f"load: {name:<46} {best[name]:>9.2f} CPU s")
    before, ours = best.values()
    print(f"load: ours / before {ours / before:>38.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args()

    tok = load_tokenizer("qwen3.6", args.cache_dir)
    assert isinstance(tok, QwenTokenizer)
    load_times(tok.cache_path)
    hf, enc, n = tok.hf, qwen_tiktoken_encoding(), args.rows
    rows = make_rows(n)

    texts = rate("render: HF apply_chat_template(tokenize=False)", n, lambda: [
        hf.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in rows])
    ours = rate("render: compiled jinja2 template (ours)", n,
                lambda: [tok.render(m) for m in rows])
    assert ours == texts
    # transformers 5 returns a BatchEncoding here although its annotations say a list.
    per_row = rate("HF apply_chat_template(tokenize=True), per row", n, lambda: [
        cast(Any, hf.apply_chat_template(m, tokenize=True, add_generation_prompt=True))[
            "input_ids"] for m in rows])
    print(f"{'(mean prompt length)':<52} {sum(map(len, per_row)) / n:>10,.0f} tokens")
    hf_batch = rate("HF batch encode (tokenizer(texts))", n,
                    lambda: hf(texts, add_special_tokens=False)["input_ids"])
    backend = rate("HF backend encode_batch_fast", n, lambda: [
        e.ids for e in hf.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)])
    pooled = rate("tiktoken encode_batch (thread pool, 8)", n, lambda: enc.encode_batch(
        [unicodedata.normalize("NFC", t) for t in texts], allowed_special="all"))
    fast = rate(f"encode_batch (ours, fast_path={tok.fast_path})", n,
                lambda: tok.encode_batch(texts))
    assert per_row == hf_batch == backend == pooled == fast, "the paths disagree on ids"
    rate("render + encode_batch (ours, end to end)", n,
         lambda: tok.encode_batch([tok.render(m) for m in rows]))


if __name__ == "__main__":
    main()
