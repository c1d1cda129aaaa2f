"""The run's manifest in Redis: pinned settings, state, total rows; a resume must match it."""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis

from fleetgen.base.contract import (
    FINISHED_AT,
    STATE_PRODUCED,
    STATE_PRODUCING,
    STATE_STOPPED,
    RunKeys,
    runs_index_key,
)
from fleetgen.base.errors import ConfigError
from fleetgen.base.redisconn import read_hash

# Settings that change what a row becomes; a resumed run must keep them.
PINNED = ("input", "files", "tokenizer", "context_length", "max_output_tokens",
          "min_output_tokens", "margin", "reserved_tokens", "max_req_input_len", "sampling", "n",
          "logprobs", "token_ids", "json_schema", "chat_template_kwargs", "reasoning", "turns")


# How a command of fleetgen starts another run instead of resuming this one, as the messages
# say it: `produce` names its run, the demo keeps its run in its --out.
NEW_RUN = "use a new --run name"


class RunManifest:
    def __init__(self, client: redis.Redis, run: str, new_run: str = NEW_RUN) -> None:
        self.redis = client
        self.run = run
        self.key = RunKeys(run).manifest
        self.new_run = new_run

    def read(self) -> dict[str, str]:
        return read_hash(self.redis, self.key)

    def total(self) -> int:
        """Rows in the input, once the producer has read all of it (0 before)."""
        return int(self.read().get("total", 0))

    def open(self, settings: dict[str, Any], expected_rows: int) -> None:
        """Start the run, or resume it after checking that the pinned settings are the same."""
        old = self.read()
        if old:
            check_same_settings(self.run, orjson.loads(old.get("settings", "{}")), settings,
                                self.new_run)
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(self.key, "state", STATE_PRODUCING)
            # Going on: the run has not ended any more (the drainer pins the end again).
            pipe.hdel(self.key, "stop_reason", FINISHED_AT)
            pipe.execute()
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key, mapping={
            "settings": orjson.dumps(settings), "state": STATE_PRODUCING,
            "started_at": time.time(), "read": 0, "expected": expected_rows,
        })
        pipe.sadd(runs_index_key(), self.run)
        pipe.execute()

    def stop_reason(self) -> str | None:
        """Why `--stop-if` stopped the run, if it did and nobody went on with --ignore-stop."""
        m = self.read()
        return m.get("stop_reason") if m.get("state") == STATE_STOPPED else None

    def stop(self, reason: str) -> None:
        self.redis.hset(self.key, mapping={"state": STATE_STOPPED, "stop_reason": reason,
                                           "stopped_at": time.time()})

    def check_files(self, files: list[str]) -> None:
        """ConfigError if the run was started on other input files (a run without a manifest,
        or from before files were pinned, passes)."""
        old = orjson.loads(self.read().get("settings", "{}"))
        if "files" in old:
            check_same_settings(self.run, {"files": old["files"]}, {"files": files},
                                self.new_run)

    def check_settings(self, settings: dict[str, Any]) -> None:
        """ConfigError if the run was started with other pinned settings: the check a resume
        makes when it opens the run, made before anything is started for it. A setting read
        from the servers (the context length the limits give) is left to then."""
        old = orjson.loads(self.read().get("settings", "{}"))
        known = {k: v for k, v in settings.items() if k != "context_length"}
        check_same_settings(self.run, {k: v for k, v in old.items() if k in known}, known,
                            self.new_run)

    def record_read(self, rows: int) -> None:
        self.redis.hset(self.key, "read", rows)

    def close(self, total: int, input_bytes: int | None = None) -> None:
        """Every row has been read: the run's total is known (and the input's size then)."""
        mapping: dict[Any, Any] = {"state": STATE_PRODUCED, "total": total, "read": total,
                                   "produced_at": time.time()}
        if input_bytes is not None:
            mapping["input_bytes"] = input_bytes
        self.redis.hset(self.key, mapping=mapping)

    def input_changed(self, input_bytes: int) -> int | None:
        """The input's size when the run was produced, if it is not `input_bytes` now (None
        also for a run produced before sizes were recorded)."""
        then = self.read().get("input_bytes")
        return int(then) if then is not None and int(then) != input_bytes else None

    def reassert(self, settings: dict[str, Any], total: int) -> bool:
        """Write the total and the state again if Redis forgot them (restarted from a copy
        taken before the producer finished reading, or before the run existed): without
        them no one can call the run complete. Returns True if anything was missing."""
        old = self.read()
        if old.get("state") == STATE_PRODUCED and old.get("total") == str(total):
            return False
        mapping: dict[Any, Any] = {"state": STATE_PRODUCED, "total": total, "read": total,
                                   "produced_at": time.time()}
        if "settings" not in old:  # the whole manifest is gone: the pins come back too
            mapping.update(settings=orjson.dumps(settings), started_at=time.time(),
                           expected=total)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.key, mapping=mapping)
        pipe.sadd(runs_index_key(), self.run)
        pipe.execute()
        return True


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
                f"run {run!r} was started with {setting_name(name)} {shown(old.get(name))}, "
                f"now {shown(new.get(name))}; resume it with the same settings, or {new_run}")


def setting_name(name: str) -> str:
    """A pinned setting as the user gives it: its flag where it has one."""
    words = {"input": "input", "sampling": "sampling options"}
    return words.get(name, "--" + name.replace("_", "-"))


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
