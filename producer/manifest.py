"""The resume check: a resumed run must keep the settings it was started with, and read the
same files. The manifest itself is fleetgen/runstate/manifest.py's; the settings that are pinned
are fleetgen/settings/runoptions.py's `PINNED`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis

from fleetgen.errors import ConfigError
from fleetgen.records.outdir import OutputDir
from fleetgen.runstate import manifest
from fleetgen.settings.runoptions import PINNED, flag_name

__all__ = [
    "NEW_RUN",
    "PINNED",
    "CheckedManifest",
    "Recorded",
    "check_same_settings",
    "files_difference",
    "recorded_in",
]

# How a command of fleetgen starts another run instead of resuming this one, as the messages
# say it: `produce` names its run, the demo keeps its run in its --out.
NEW_RUN = "use a new --run name"


class CheckedManifest:
    """The run's manifest as the producer uses it: fleetgen/runstate/manifest.py's verbs
    (`record`), and a start or resume that checks the pinned settings first. `read()` is the
    hash as stored, for `Producer.manifest()` (producer/loop.py) and its tests."""

    def __init__(self, client: redis.Redis, run: str, new_run: str = NEW_RUN,
                 recorded: Recorded | None = None) -> None:
        self.run = run
        self.new_run = new_run
        self.record = manifest.RunManifest(client, run)
        # The settings the output files' rows were made with (their summary.json's): a
        # finished run's Redis state is gone, and these are then what a rerun is held to.
        self.recorded = recorded

    def read(self) -> dict[str, str]:
        return self.record.raw()

    def total(self) -> int:
        """Requests in the run, once the producer has read all of the input (0 before)."""
        return self.record.read().total or 0

    def open(self, settings: dict[str, Any]) -> None:
        """Start the run, or resume it after checking that the pinned settings are the same."""
        old = self.record.read()
        if old.exists:
            check_same_settings(self.run, old.pinned, settings, self.new_run)
            self.record.resume()
            return
        if self.recorded is not None:  # the files' rows were made with these
            check_same_settings(self.run, self.recorded.settings, settings, self.new_run)
        self.record.start(settings)
        if self.recorded is not None and self.recorded.clock is not None:
            started, worked_s = self.recorded.clock
            self.record.carry_clock(started, time.time() - started - worked_s)

    def stop_reason(self) -> str | None:
        """Why `--stop-if` stopped the run, if it did and nobody went on with --ignore-stop."""
        m = self.record.read()
        return m.stop_reason if m.stopped is not None else None

    def stop(self, reason: str) -> None:
        self.record.stop(reason)

    def record_read(self, requests: int) -> None:
        self.record.record_read(requests)

    def close(self, total: int, input_bytes: int | None = None,
              input_rows: int | None = None) -> None:
        self.record.close(total, input_bytes, input_rows)

    def reassert(self, settings: dict[str, Any], total: int) -> bool:
        return self.record.reassert(settings, total)

    def check_resume(self, files: list[str], settings: dict[str, Any],
                     input_bytes: int) -> int | None:
        """The checks a resume makes before anything is started for it, on one read of the
        manifest: ConfigError if the run was started on other input files (a run without a
        manifest, or from before files were pinned, passes) or with other pinned settings (a
        setting read from the servers, the context length the limits give, is left to the
        opening). Returns the input's size when the run was produced if it is not
        `input_bytes` now (None also for a run produced before sizes were recorded)."""
        stored = self.record.read()
        if "files" in stored.pinned:
            check_same_settings(self.run, {"files": stored.pinned["files"]},
                                {"files": files}, self.new_run)
        old = stored.pinned if stored.exists else \
            (self.recorded.settings if self.recorded else {})
        known = {k: v for k, v in settings.items() if k != "context_length"}
        check_same_settings(self.run, {k: v for k, v in old.items() if k in known}, known,
                            self.new_run)
        then = stored.input_bytes
        return then if then is not None and then != input_bytes else None


@dataclass(frozen=True)
class Recorded:
    """What an output directory's summary.json says of its run: the pinned settings its rows
    were made with, and its clock (started_at, wall_s) if it has one."""

    settings: dict[str, Any]
    clock: tuple[float, float] | None


def recorded_in(out: Path | None, run: str) -> Recorded | None:
    """`out`'s record of `run` (None: no output there yet, another run's, or a summary from
    before settings were kept)."""
    if out is None:
        return None
    try:
        summary = OutputDir(out).read_summary() or {}
    except orjson.JSONDecodeError:  # damaged: the drainer rewrites it from the files
        return None
    settings = summary.get("settings")
    if summary.get("run") != run or not isinstance(settings, dict):
        return None
    started, wall = summary.get("started_at"), summary.get("wall_s")
    clock = (float(started), float(wall)) if started and wall else None
    return Recorded({k: v for k, v in settings.items() if k in PINNED}, clock)


def check_same_settings(run: str, old: dict[str, Any], new: dict[str, Any],
                        new_run: str = NEW_RUN) -> None:
    for name in PINNED:
        if name == "files" and name in old and old[name] != new.get(name):
            raise ConfigError(f"run {run!r} was started with other input files: "
                              f"{files_difference(old[name], new.get(name) or [])}; resume it "
                              f"with the same files (a row's number in the run depends on "
                              f"them), or {new_run}")
        if name in old and old.get(name) != new.get(name):
            raise ConfigError(
                f"run {run!r} was started with {flag_name(name)} {shown(old.get(name))}, "
                f"now {shown(new.get(name))}; resume it with the same settings, or {new_run}")


def shown(value: Any) -> str:
    """A setting's value in a message: JSON's words, and none of Python's (`None`)."""
    if value is None:
        return "unset (the default)"
    if isinstance(value, str):
        return repr(value)
    return orjson.dumps(value).decode()


def files_difference(old: list[str], new: list[str], shown: int = 3) -> str:
    """What changed between two file lists, in a few words (a list may hold thousands)."""
    def some(names: list[str]) -> str:
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        return ", ".join(names[:shown]) + more

    old_set, new_set = set(old), set(new)
    added = [n for n in new if n not in old_set]
    removed = [n for n in old if n not in new_set]
    parts = [f"{len(added)} new ({some(added)})"] if added else []
    parts += [f"{len(removed)} gone ({some(removed)})"] if removed else []
    return "; ".join(parts) or "the same files in another order"
