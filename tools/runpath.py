"""What one `fleetgen run` does to reach its resources, counted in its own process (its workers,
Valkey and the simulator are other processes): opens of the input and of summary.json, TCP
connections to Redis, input resolutions, `RunKeys` built, and the run manifest's reads before
the first row is queued. Issue 49's before/after figures; run it twice for a fresh run and
its resume:

    .venv/bin/python tools/runpath.py [--rows N] [--keep DIR]

It starts one simulated server (a process of its own) and runs `fleetgen run` on N rows of the
sample prompts against it, with Python's audit hooks (`sys.addaudithook`: every `open` and
`socket.connect` of the process) and a counting wrapper on redis-py's command packer."""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANIFEST_READS = {"HGET", "HGETALL", "HMGET", "HEXISTS", "HLEN", "HKEYS", "EXISTS", "TYPE"}
ENQUEUES = {"LPUSH", "RPUSH"}


class Counts:
    """What the hooks saw, by the thread that saw it (all of them count: the producer runs in
    a thread of the `run` process)."""

    def __init__(self, input_path: Path, engine_port: int) -> None:
        self.input = str(input_path.resolve())
        self.engine_port = engine_port
        self.lock = threading.Lock()
        self.c: collections.Counter[str] = collections.Counter()
        self.queued = False

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            path = os.fsdecode(args[0])
            if os.path.abspath(path) == self.input:
                self._add("input opens")
            elif path.endswith("summary.json"):
                self._add("summary.json opens")
        elif event == "socket.connect" and isinstance(args[1], tuple) and len(args[1]) >= 2:
            port = args[1][1]
            self._add("engine connections" if port == self.engine_port else
                      "redis connections")

    def command(self, args: tuple[Any, ...]) -> None:
        if not args:
            return
        name = os.fsdecode(args[0]).upper() if isinstance(args[0], bytes | str) else ""
        key = os.fsdecode(args[1]) if len(args) > 1 and isinstance(args[1], bytes | str) else ""
        if name in ENQUEUES:
            self.queued = True
        if key.endswith(":manifest") and name in MANIFEST_READS and not self.queued:
            self._add("manifest reads before the first row")

    def _add(self, what: str) -> None:
        with self.lock:
            self.c[what] += 1


def instrument(counts: Counts) -> None:
    import redis.connection

    from fleetgen.runstate import keys

    sys.addaudithook(counts.audit)
    for name in ("PythonRespSerializer", "HiredisRespSerializer"):
        cls = getattr(redis.connection, name, None)
        if cls is None:
            continue
        original = cls.pack

        def pack(self: Any, *args: Any, _original: Any = original) -> Any:
            counts.command(args)
            return _original(self, *args)

        cls.pack = pack
    init = keys.RunKeys.__init__

    def keys_init(self: Any, run: str) -> None:
        counts._add("RunKeys built")
        if not counts.queued:
            counts._add("RunKeys built before the first row")
        init(self, run)

    keys.RunKeys.__init__ = keys_init  # type: ignore[method-assign]
    # Before any module takes the name with `from producer.inputs import resolve_input`.
    import producer.inputs

    resolve = producer.inputs.resolve_input

    def resolve_input(spec: Any) -> Any:
        if not isinstance(spec, producer.inputs.Inputs):  # an Inputs is handed back as it is
            counts._add("input resolutions")
        return resolve(spec)

    producer.inputs.resolve_input = resolve_input


def start_sim() -> tuple[subprocess.Popen[str], int]:
    sim = subprocess.Popen([sys.executable, "-m", "fleetgen.simulator", "--port", "0",
                            "--ttft-ms", "5", "--tpot-ms", "0.2"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert sim.stdout is not None
    for line in sim.stdout:
        found = re.search(r"serving \d+ server\(s\) on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return sim, int(found.group(1))
    raise SystemExit("the simulator did not start")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--keep", type=Path, help="the directory of the prompts and the --out "
                   "(a second call resumes the run there)")
    args = p.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="runpath-"))
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out"
    prompts = work / "prompts.jsonl"
    if not prompts.exists():
        lines = (ROOT / "fleetgen/data/sample_prompts.jsonl").read_text().splitlines()
        prompts.write_text("\n".join(lines[:args.rows]) + "\n")
    sim, port = start_sim()
    try:
        counts = Counts(prompts, port)
        instrument(counts)
        from fleetgen.cli.main import main as fleetgen

        code = fleetgen(["run", str(prompts), "--engine-url", f"http://127.0.0.1:{port}",
                         "--out", str(out)])
    finally:
        sim.terminate()
        sim.wait(10)
    figures = {"exit": code, **dict(sorted(counts.c.items()))}
    print(json.dumps(figures, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
