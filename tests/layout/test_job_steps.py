"""The job is a list of steps and hands nothing below it a way back up (issue 49,
docs/architecture.md): the only callables the job's modules give to the parts they drive are
the stop flag (a question asked of the job), a sink for the terminal's lines, a thread's body
and the producer's own wake, given to the thread that runs it. A hook such as the old
`on_redis`, `on_report`, `before_workers` or `on_progress` is found by `handed_callables`,
and `stop_in_reverse` stops every step started, last first."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetgen.cli.job import job_steps, stop_in_reverse

ROOT = Path(__file__).resolve().parents[2]
JOB = ("fleetgen/cli/job.py", "fleetgen/cli/steps.py", "fleetgen/cli/nodejob.py",
       "fleetgen/cli/run.py", "fleetgen/cli/demo.py")
# What the job may hand down, each by what it is: none of them lets a part run job code.
HANDED = {
    ("producer.send_pass", "should_stop"): "the stop flag, asked",
    ("producer.wait_until_generated", "should_stop"): "the stop flag, asked",
    ("drainer.ticks", "should_stop"): "the stop flag, asked",
    ("closing.wait_for_leavers", "should_stop"): "the stop flag, asked",
    ("engines.start", None): "where the engines' lines are printed",
    ("LogLine", None): "where the run's lines are printed",
    ("FleetView", None): "where the fleet's notes are printed (above the bar)",
    ("Beside", None): "the producer thread's body: the thread is the step's own",
    ("Beside", "wake"): "the producer's own wake, called by its thread once all is written",
    ("field", "default_factory"): "a dataclass default",
}


def handed_callables(source: str) -> list[tuple[str, str | None]]:
    """(callee, keyword) of each lambda, nested function or `should_stop`/`say`/`note`/`wake`
    attribute passed as an argument."""
    tree = ast.parse(source)
    nested = {inner.name for outer in ast.walk(tree) if isinstance(outer, ast.FunctionDef)
              for inner in ast.walk(outer)
              if inner is not outer and isinstance(inner, ast.FunctionDef)}
    found = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        named = [(None, a) for a in call.args] + [(k.arg, k.value) for k in call.keywords]
        for keyword, value in named:
            if isinstance(value, ast.Lambda) \
                    or (isinstance(value, ast.Name) and value.id in nested) \
                    or (isinstance(value, ast.Attribute)
                        and value.attr in ("should_stop", "say", "note", "wake")):
                found.append((ast.unparse(call.func), keyword))
    return found


def test_the_job_hands_down_only_a_stop_flag_a_line_sink_and_a_thread_body() -> None:
    handed = [(path, h) for path in JOB for h in handed_callables((ROOT / path).read_text())]
    assert handed  # the stop flag is handed: the scan sees the job's calls
    assert [f"{path}: {callee}({keyword})" for path, (callee, keyword) in handed
            if (callee, keyword) not in HANDED] == []


@pytest.mark.parametrize("hook", ["client.on_redis = None\nstart(on_redis=lambda r: r)",
                                  "def f(run):\n    def linger(): pass\n    wait(linger)",
                                  "drainer.run(on_progress=run.note)"])
def test_a_hook_handed_down_is_found(hook: str) -> None:
    assert [h for h in handed_callables(hook) if h not in HANDED]


class Recorded:
    def __init__(self, name: str, log: list[str], fails: bool = False) -> None:
        self.name, self.log, self.fails = name, log, fails

    def stop(self, run: object) -> None:
        self.log.append(self.name)
        if self.fails:
            raise RuntimeError(f"{self.name} failed to stop")


def test_steps_stop_in_reverse_each_whatever_the_one_before_raised() -> None:
    log: list[str] = []
    started = [Recorded("valkey", log), Recorded("workers", log, fails=True),
               Recorded("drain", log, fails=True)]
    with pytest.raises(RuntimeError, match="drain failed"):
        stop_in_reverse(started, run=None)  # type: ignore[arg-type]
    assert log == ["drain", "workers", "valkey"]


def test_the_job_is_one_list_from_valkey_to_close() -> None:
    job = SimpleNamespace(after_redis=[], after_report=[])  # all job_steps reads of the job
    names = [type(step).__name__ for step in job_steps(job)]  # type: ignore[arg-type]
    assert names == ["Valkey", "RunState", "Engines", "Workers", "Drain", "EstimateAnswers",
                     "Produce", "UntilWritten", "ReportPage", "Close"]
