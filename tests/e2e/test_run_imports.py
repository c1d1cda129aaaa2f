"""`fleetgen run` against real URLs imports no `fleetgen.simulator` module (issue 49): the
simulator is a server it is given, started apart as a user starts one. Each process of the run
(the command and the workers it starts) writes the modules it holds at exit, through a
sitecustomize hook on its PYTHONPATH; the simulator, started before with its own environment,
has no hook."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.cli import fleetgen_cli
from tests.support.pipeline import assert_exactly_once, make_prompts
from tests.support.simproc import sim_process
from tests.support.sims import engine_flags

# Python imports `sitecustomize` at start-up from its path: this one writes, at exit, the
# modules the process holds to DIR/PID.modules (DIR from the environment).
HOOK = '''\
import atexit, os, sys

def _write():
    path = os.path.join(os.environ["FLEETGEN_TEST_MODULES_DIR"], f"{os.getpid()}.modules")
    with open(path, "w") as out:
        out.write("\\n".join(sorted(sys.modules)))

atexit.register(_write)
'''


def hooked_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a process that writes its modules at exit, and where it does."""
    hook, seen = tmp_path / "hook", tmp_path / "modules"
    hook.mkdir()
    seen.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "FLEETGEN_TEST_MODULES_DIR": str(seen)}, seen


def modules_of(seen: Path, pid: int) -> set[str]:
    path = seen / f"{pid}.modules"
    assert path.exists(), f"process {pid} wrote no module list: {sorted(seen.iterdir())}"
    return set(path.read_text().split())


def simulator_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m == "fleetgen.simulator"
                  or m.startswith("fleetgen.simulator."))


def test_the_hook_sees_the_simulator_where_it_is_imported(tmp_path: Path) -> None:
    """The check below can fail: `fleetgen sim --help` does import the simulator."""
    env, seen = hooked_env(tmp_path)
    proc = subprocess.run(fleetgen_cli("sim", "--help"), env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (path,) = seen.iterdir()
    assert "fleetgen.simulator.config" in simulator_modules(set(path.read_text().split()))


def test_fleetgen_run_on_real_urls_imports_no_simulator_module(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    kinds = make_prompts(prompts, 20)
    env, seen = hooked_env(tmp_path)
    with sim_process(tmp_path / "sim.log", count=2) as urls:
        proc = subprocess.Popen(
            fleetgen_cli("run", str(prompts), *engine_flags(urls), "--out", "out"),
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output = proc.communicate(timeout=300)[0].decode(errors="replace")
    assert proc.returncode == 0, output[-3000:]
    assert_exactly_once(tmp_path / "out", set(kinds["good"]))
    run = modules_of(seen, proc.pid)
    # What the command ran: the job, its fleet and its drainer (a hook that wrote nothing
    # useful would fail here).
    assert {"fleetgen.cli.run", "fleetgen.local.fleet", "fleetgen.drainer"} <= run
    assert simulator_modules(run) == []
    # Its workers too, those that exited through Python's own exit.
    workers = [path for path in seen.iterdir() if path.stem != str(proc.pid)]
    for path in workers:
        assert simulator_modules(set(path.read_text().split())) == [], path.name
    print(f"\nfleetgen run: {len(run)} modules, none of fleetgen.simulator; "
          f"{len(workers)} worker process(es) checked too")
