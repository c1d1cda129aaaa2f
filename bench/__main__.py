"""`python -m bench [NAME ...]`: run every bench or the named one; tables out, JSON figures
in bench/figures/ (tracked; `python tools/perf_tables.py` turns them into the docs' tables)."""

from __future__ import annotations

import importlib
import os
import sys
import time

from bench.common import RUN_ENV

# name -> module; each module has main(argv) -> int and prints its own table.
BENCHES = {
    "producer": "bench.produce",
    "drainer": "bench.drain",
    "memory": "bench.memory",
    "ceiling": "bench.ceiling",
    "central": "bench.central",
    "guard": "bench.guard",
    "worker": "bench.worker_cpu",
    "gpu": "bench.gpu_pool",
    "fleet": "bench.fleet",
    "ordering": "bench.ordering",
    "turns": "bench.turns",
    "affinity": "bench.affinity",
    "fleet_scale": "bench.fleet_scale",
    "real": "bench.real",
    "real_rates": "bench.real_rates",
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print("benches:", ", ".join(BENCHES), "(extra arguments go to a single named bench)")
        return 0
    if argv and argv[0] in BENCHES:
        names, rest = [argv[0]], argv[1:]
    else:
        names, rest = list(BENCHES), argv
        # Every file of this run carries the same run id: the docs can say which run a
        # figure is from.
        os.environ.setdefault(RUN_ENV, "make bench " + time.strftime("%Y-%m-%dT%H:%M:%S"))
    for name in names:
        started = time.monotonic()
        print(f"== bench {name} ==", flush=True)
        code = importlib.import_module(BENCHES[name]).main(rest if len(names) == 1 else [])
        print(f"== bench {name}: {time.monotonic() - started:.0f} s ==\n", flush=True)
        if code:
            return int(code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
