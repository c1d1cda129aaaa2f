"""producer/runner.py on a real Valkey without workers: the resume decision (fresh, complete,
complete but grown) and what a caller's hooks see, in order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis

from fleetgen.queue.contract import QUEUE
from fleetgen.runstate.keys import RunKeys
from producer.inputs import resolve_input
from producer.runner import Resume, check_resume, produce
from producer.settings import ProducerSettings


class Recorder:
    """Hooks that write down what they are told."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def resuming(self, resume: Resume) -> None:
        self.calls.append(("resuming", resume))

    def stop_flag(self) -> Callable[[], bool]:
        self.calls.append(("stop_flag",))
        return lambda: False

    def read(self, rows: int, total: int) -> None:
        self.calls.append(("read", rows, total))

    def generated(self, rows: int, total: int) -> None:
        self.calls.append(("generated", rows, total))

    def close(self) -> None:
        self.calls.append(("close",))


def test_a_run_resumes_or_not_as_its_state_says(tmp_path: Path, redis_url: str,
                                                rclient: redis.Redis) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "r{i}", "prompt": "q {i}"}}\n' for i in range(3)))
    settings = ProducerSettings(input=prompts, run="resume", redis_url=redis_url,
                                context_length=4096)
    fresh = check_resume(settings, resolve_input(settings.input), rclient)
    assert fresh == Resume(complete=False, size_bytes=prompts.stat().st_size)
    assert not fresh.nothing_to_do

    hooks = Recorder()
    report = produce(settings, hooks=hooks)
    assert (report.read, report.enqueued) == (3, 3) and rclient.llen(QUEUE) == 3
    assert hooks.calls[0] == ("resuming", fresh)
    assert hooks.calls[1] == ("stop_flag",)  # once built, before the first batch
    assert hooks.calls[-2:] == [("read", 3, 3), ("close",)]

    # Every row written (as a drainer would publish it): complete, nothing to do.
    rclient.hset(RunKeys("resume").written, mapping={"done": 3})
    assert check_resume(settings, resolve_input(settings.input), rclient).nothing_to_do
    hooks = Recorder()
    assert produce(settings, hooks=hooks).read == 0
    assert [c[0] for c in hooks.calls] == ["resuming"]  # nothing built, no SIGTERM flag

    # Complete, but a row was appended since: read again.
    size = prompts.stat().st_size
    with prompts.open("a") as f:
        f.write('{"id": "r3", "prompt": "q 3"}\n')
    grown = check_resume(settings, resolve_input(settings.input), rclient)
    assert grown.complete and grown.grown_from == size and not grown.nothing_to_do
    assert produce(settings).read == 4


def test_a_resume_with_other_settings_is_refused_before_anything_starts(
        tmp_path: Path, redis_url: str, rclient: redis.Redis) -> None:
    """check_resume needs only Redis, so a caller refuses a mismatch before it starts servers
    and workers; the line names the flag and its values in the user's words (never Python's
    None) and how this command starts another run."""
    import dataclasses

    import pytest

    from fleetgen.errors import ConfigError

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "r0", "prompt": "q"}\n')
    settings = ProducerSettings(input=prompts, run="pinned", redis_url=redis_url,
                                context_length=4096)
    produce(settings)
    queued = rclient.llen(QUEUE)
    capped = dataclasses.replace(settings, max_output_tokens=100, new_run="use another --out")
    with pytest.raises(ConfigError) as refused:
        check_resume(capped, resolve_input(capped.input), rclient)
    assert str(refused.value) == (
        "run 'pinned' was started with --max-output-tokens unset (the default), now 100; "
        "resume it with the same settings, or use another --out")
    assert "None" not in str(refused.value) and rclient.llen(QUEUE) == queued
    other = dataclasses.replace(settings, chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(ConfigError, match=r"--chat-template-kwargs \{\}, now "
                       r'\{"enable_thinking":false\}; .* or use a new --run name$'):
        check_resume(other, resolve_input(other.input), rclient)
    check_resume(settings, resolve_input(settings.input), rclient)  # the same settings resume
