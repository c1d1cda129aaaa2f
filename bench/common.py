"""Shared bench helpers: deterministic prompt files, tables, JSON figures, process memory, and
the child process a bench measures in."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from fleetgen.settings.envvars import BENCH_FIGURES, BENCH_RUN

# Tracked: the tables of docs/performance.md and docs/scale.md are generated from these files
# (tools/perf_tables.py). FLEETGEN_BENCH_FIGURES moves them elsewhere (the smoke test must
# not overwrite a real run's figures).
FIGURES_DIR = Path(BENCH_FIGURES.value()
                   or Path(__file__).resolve().parent / "figures")
# Set by `python -m bench` when it runs every bench, so each file says which run it is from.
RUN_ENV = BENCH_RUN.name

# Words that tokenize to about one Qwen3.6 token each, plus a few multi-token snippets so
# the text is not all ASCII (the tokenizer's slow paths must be exercised too).
WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "this", "are", "or", "from", "at", "which", "an", "have", "not", "but", "data",
    "model", "token", "server", "request", "queue", "budget", "prompt", "python", "function",
    "value", "return", "error", "context", "length", "batch", "worker", "result", "stream",
    "latency", "throughput", "2024", "42", "3.14",
)
SNIPPETS = (
    "\n```python\ndef f(x):\n    return x * {i}\n```\n",
    "\n请用中文回答这个问题,谢谢。\n",
    "\n| a | b |\n|---|---|\n| {i} | {i} |\n",
    "\nÉcris une réponse courte, s'il te plaît.\n",
)


def chat_row(i: int, words: int, rng: random.Random) -> dict[str, Any]:
    """One system+user chat row of about `words` + 30 tokens."""
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return {"id": f"r{i}", "messages": [
        {"role": "system", "content": "You are a helpful assistant. Answer precisely."},
        {"role": "user", "content": body + rng.choice(SNIPPETS).format(i=i)}]}


def write_uniform_prompts(path: Path, count: int, words: int = 220, seed: int = 0) -> Path:
    """`count` rows of about 300 tokens each (the issue's producer target), streamed to disk."""
    rng = random.Random(seed)
    with path.open("wb") as f:
        for i in range(count):
            f.write(orjson.dumps(chat_row(i, words, rng)) + b"\n")
    return path


def write_varied_prompts(path: Path, count: int, long_share: float = 0.01,
                         seed: int = 0) -> Path:
    """Prompt lengths from 30 to ~3,000 tokens, and `long_share` of ~4,200-7,200 tokens: long
    enough that a fixed max_new_tokens=4096 overflows an 8,192-token context."""
    rng = random.Random(seed)
    with path.open("wb") as f:
        for i in range(count):
            words = (rng.randint(3500, 6000) if rng.random() < long_share
                     else int(rng.uniform(0, 1) ** 2 * 2500))
            f.write(orjson.dumps(chat_row(i, words, rng)) + b"\n")
    return path


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (what `make bench` prints)."""
    cells = [[str(h) for h in header]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells[1:]]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def save(name: str, data: dict[str, Any], arguments: dict[str, Any] | None = None,
         command: str | None = None) -> Path:
    """Write bench/figures/<name>.json: the figures plus the machine, the date, the sizes
    (the bench's arguments) and the git commit they were measured at. `command` is what
    ran it where that is not `python -m bench <name>`."""
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    data = {"bench": name, "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "run": os.environ.get(RUN_ENV) or f"{command or f'python -m bench {name}'} (alone)",
            "commit": git_commit(), "machine": machine(),
            "arguments": {k: str(v) if isinstance(v, Path) else v
                          for k, v in (arguments or {}).items()},
            **data}
    path = FIGURES_DIR / f"{name}.json"
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    return path


def git_commit() -> str:
    """HEAD's commit, with "+dirty" when tracked files under bench/ or the product differ
    (figures measured on uncommitted code say so)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":!bench/figures", ":!docs", ":!README.md"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    # The load average says whether something else shared the cores during the run.
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_1_5_15": os.getloadavg()}


def self_cpu_s() -> float:
    """This process's CPU seconds (user + system, all threads): what a bench's in-process
    part (a producer, a plain client, a calibration loop) spent."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_bytes() -> int:
    """This process's peak RSS (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# The hidden subcommand a bench runs itself as, to measure a process of its own (its peak RSS,
# its rate from a cold start): `python -m bench.NAME child --FLAG VALUE ...`.
CHILD = "child"


def add_child(parser: argparse.ArgumentParser, *flags: str) -> argparse.ArgumentParser:
    """The `child` subcommand (`args.role == CHILD`), each of `flags` a required value."""
    child = parser.add_subparsers(dest="role").add_parser(CHILD)
    for flag in flags:
        child.add_argument(f"--{flag}", required=True)
    return child


def run_child(module: str, **flags: Any) -> dict[str, Any]:
    """`module`'s child with `flags`, to its end; the JSON object it prints last."""
    argv = [sys.executable, "-m", module, CHILD,
            *(word for name, value in flags.items() for word in (f"--{name}", str(value)))]
    proc = subprocess.run(argv, capture_output=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed:\n{proc.stderr.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return result
