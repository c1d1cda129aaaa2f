"""Prompt files, the producer and the drainer run in this process against a fleet, and the
output read back: every request exactly once."""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from fleetgen.cli.beside import Beside
from fleetgen.drainer import Drainer
from fleetgen.local.fleet import LocalFleet
from fleetgen.queue.contract import request_key
from fleetgen.queue.redisconn import connect
from producer.progress import Progress
from producer.runner import produce as produce_run
from producer.settings import ProducerSettings
from producer.tokenizer import QwenTokenizer, load_tokenizer
from tests.support.fleet import sims_of

WORDS = ["alpha", "beta", "gamma", "数据", "模型", "😀", "def f(x):\n    return x * 2\n",
         "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "\t", "\n\n"]


def make_prompts(path: Path, n: int, *, too_long: int = 0, malformed: int = 0,
                 seed: int = 7, long_tokens: int = 12000) -> dict[str, list[str]]:
    """n good rows of varied length, plus too-long and malformed ones spread through.
    Returns the ids of each kind ('good', 'too_long') and 'malformed' line markers."""
    rng = random.Random(seed)
    lines: list[bytes] = []
    kinds: dict[str, list[str]] = {"good": [], "too_long": [], "malformed": []}
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 400)))
        row = {"id": f"p{i}", "messages": [{"role": "user", "content": words}], "k": i}
        lines.append(orjson.dumps(row))
        kinds["good"].append(f"p{i}")
    for j in range(too_long):
        text = "lorem ipsum dolor " * (long_tokens // 3)
        lines.insert(rng.randrange(len(lines)), orjson.dumps(
            {"id": f"long{j}", "messages": [{"role": "user", "content": text}]}))
        kinds["too_long"].append(f"long{j}")
    for j in range(malformed):
        lines.insert(rng.randrange(len(lines)), f'{{"id": "bad{j}", "messages": [}}'.encode())
        kinds["malformed"].append(f"bad{j}")
    path.write_bytes(b"\n".join(lines) + b"\n")
    return kinds


@functools.lru_cache(maxsize=1)
def qwen_tokenizer() -> QwenTokenizer:
    """Qwen3.6's tokenizer as `fleetgen run` loads it by default (its offline build)."""
    tok = load_tokenizer("qwen3.6")
    assert isinstance(tok, QwenTokenizer)
    return tok


def row_of(tokens: int, row_id: str) -> dict[str, Any]:
    """A chat row whose rendered prompt is exactly `tokens` tokens (' the' is one token)."""
    tok = qwen_tokenizer()
    words = max(1, tokens - 20)
    for _ in range(10):
        messages = [{"role": "user", "content": "the" + " the" * (words - 1)}]
        count = tok.count(tok.render(messages))
        if count == tokens:
            return {"id": row_id, "messages": messages}
        words += tokens - count
    raise AssertionError(f"cannot build a row of {tokens} tokens")


def produce(fleet: LocalFleet, prompts: Path, run: str, *, wait: bool = False,
            reconcile_interval_s: float = 30.0, **options: Any) -> Progress:
    """The product's own producer path, in this process: `fleetgen produce --no-wait`, or
    with `wait` the default `fleetgen produce`, which stays and re-enqueues lost rows."""
    if "context_length" not in options:  # a fleet of real engines always names its own
        options["context_length"] = sims_of(fleet).context_length
    settings = ProducerSettings(input=prompts, run=run, redis_url=fleet.redis_url, **options)
    report: Progress = produce_run(settings, wait=wait,
                                   reconcile_interval_s=reconcile_interval_s)
    return report


def run_pipeline(fleet: LocalFleet, prompts: Path, run: str, out: Path,
                 timeout_s: float = 180.0, **options: Any) -> dict[str, Any]:
    """Producer in a thread, drainer here until the run is complete, as the job runs them
    (fleetgen/cli/job.py); returns the summary."""
    producer = Beside(lambda: produce(fleet, prompts, run, **options))
    return drain(fleet, run, out, producer.errors, timeout_s=timeout_s)


def drain_until_complete(redis_url: str, run: str, out: Path, timeout_s: float = 60,
                         check: Callable[[Drainer], None] | None = None) -> Drainer:
    """A drainer over the run's stream until the run is complete or the deadline passes (the
    caller asserts `complete()`); `check` runs at each batch (to fail at once). Returns it
    closed, its tally and summary readable."""
    drainer = Drainer(connect(redis_url), run, out, block_ms=100)
    drainer.recover()
    deadline = time.monotonic() + timeout_s
    try:
        for _ in drainer.ticks(should_stop=lambda: time.monotonic() > deadline):
            if check is not None:
                check(drainer)
    finally:
        drainer.close()
    return drainer


def drain(fleet: LocalFleet, run: str, out: Path, errors: list[BaseException] | None = None,
          timeout_s: float = 180.0) -> dict[str, Any]:
    """Drain until the run is complete; fail (with the drainer's view) past the deadline or
    at once when the producer beside it failed (`errors`)."""

    def check(_: Drainer) -> None:
        if errors:
            raise errors[0]

    drainer = drain_until_complete(fleet.redis_url, run, out, timeout_s, check)
    summary = drainer.write_summary()
    assert summary["complete"], f"run {run} not complete after {timeout_s} s: {summary}"
    return summary


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows as a JSONL input file."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    """Lines as they are (a malformed one too) as an input file."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_output(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Parse every output file; a torn or invalid line fails the test here."""
    data: dict[str, list[dict[str, Any]]] = {}
    for kind in ("results", "failures", "rejected", "holdout"):
        path = out / f"{kind}.jsonl"
        raw = path.read_bytes() if path.exists() else b""
        assert raw == b"" or raw.endswith(b"\n"), f"{path} ends with a torn line"
        data[kind] = [orjson.loads(line) for line in raw.splitlines()]
    return data


def assert_exactly_once(out: Path, expected_ids: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Every expected request once across results/failures/rejected/holdout, nothing else, no
    duplicate. A request is its id, or `id#sample` for one sample of several."""
    data = read_output(out)
    assert not [r for kind in data.values() for r in kind if r.get("id") is None], \
        "output lines with a null id"
    seen = Counter(request_key(r) for kind in data.values() for r in kind)
    dupes = {i: c for i, c in seen.items() if c > 1}
    assert not dupes, f"ids written more than once: {list(dupes.items())[:10]}"
    ids = set(seen)
    assert ids == expected_ids, (f"missing {sorted(expected_ids - ids)[:10]}, "
                                 f"unexpected {sorted(ids - expected_ids)[:10]}")
    return data
