"""`--turns all`: a conversation's user turns and the history each next turn is rendered from
(pure), and the drainer's output files followed as they grow: the truth of which turns are
written and of the answers the next turns are built from (docs/design.md "Every turn")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from fleetgen.errors import ConfigError
from fleetgen.queue.contract import KIND_FAILURE, KIND_REJECTED, KIND_RESULT, blocked_by, slot_of
from fleetgen.records.outcomes import split_result
from fleetgen.records.outdir import OutputDir

Message = dict[str, Any]


def user_turns(messages: list[Message]) -> list[list[Message]]:
    """The conversation cut at its assistant turns (the input's own answers, discarded): the
    messages each turn answers, a system message with the first. ValueError names what is
    wrong: no user turn, an empty user turn, an answer with no question before it."""
    turns: list[list[Message]] = [[]]
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            if not any(m["role"] == "user" for m in turns[-1]):
                raise ValueError(f"bad_turns: turn {index} is an assistant answer with no "
                                 "user turn before it")
            turns.append([])
            continue
        if message["role"] == "user" and _empty(message.get("content")):
            raise ValueError(f"empty_turn: user turn {index} is empty")
        turns[-1].append(message)
    if not turns[-1]:
        turns.pop()
    if not turns or not any(m["role"] == "user" for m in turns[0]):
        raise ValueError("no_user_turn: the conversation has no user turn to answer")
    return turns


def _empty(content: Any) -> bool:
    if isinstance(content, str):
        return not content.strip()
    return isinstance(content, list) and not any(
        isinstance(part, dict) and str(part.get("text") or "").strip() for part in content)


def answer_message(record: dict[str, Any]) -> Message:
    """A written answer as the history turn it becomes: the completion, and its reasoning as
    `reasoning_content`, which the chat template keeps or drops by its own rule (Qwen3.6:
    kept after the last user turn or with `preserve_thinking`)."""
    message: Message = {"role": "assistant", "content": str(record.get("completion") or "")}
    if isinstance(record.get("reasoning"), str):
        message["reasoning_content"] = record["reasoning"]
    return message


def turn_messages(turns: list[list[Message]], answers: list[Message]) -> list[Message]:
    """Turn len(answers) + 1's prompt: u1, a1', ..., uk, ak', u(k+1)."""
    messages: list[Message] = []
    for asked, answer in zip(turns, answers, strict=False):
        messages += [*asked, answer]
    return messages + turns[len(answers)]


def row_object(record: dict[str, Any]) -> dict[str, Any]:
    """The input row a result answered: its id and its own fields (`split_result`)."""
    return {"id": record["id"], **split_result(record).row}


class WrittenTurns:
    """The drainer's output directory, read as it grows (whole lines only: a torn tail was
    never acknowledged): which slots have an outcome, how many slots are settled (written, or
    held back by a failed turn), and where each unfinished conversation's answers are, so the
    next turn's history is read back from the results file (8 bytes a turn, not the texts)."""

    def __init__(self, out: Path, run: str) -> None:
        self.out = out
        self.dir = OutputDir(out)
        self.run = run
        self.kinds = bytearray()  # by slot: 0 nothing, 1 result, 2 rejected
        self.written = 0
        self.failures: dict[int, int] = {}  # failed slot -> later turns it holds back
        self._failures_seen: tuple[int, int, int] | None = None
        self._offsets: dict[int, dict[int, int]] = {}  # first slot -> turn -> byte offset
        # The slot of the next turn of every result seen whose next turn has no outcome yet,
        # with the offset of that result.
        self.pending: dict[int, int] = {}
        self._pos = {KIND_RESULT: 0, KIND_REJECTED: 0}
        self._results: BinaryIO | None = None

    @classmethod
    def of_run(cls, out: Path, run: str) -> WrittenTurns:
        """The turns `run`'s drainer writes in `out`; ConfigError if another run's does."""
        written = cls(out, run)
        written.check_owner()
        return written

    def check_owner(self) -> None:
        owner = self.dir.owner()
        if owner is not None and owner != self.run:
            raise ConfigError(f"--out {self.out} holds the output of run "
                              f"{owner!r}, not {self.run!r}; give the "
                              "directory this run's drainer writes")

    def has(self, slot: int) -> bool:
        return (slot < len(self.kinds) and self.kinds[slot] != 0) or slot in self.failures

    def settled(self) -> int:
        """Slots with an outcome in the files, plus the later turns failed turns hold back."""
        return self.written + sum(1 + later for slot, later in self.failures.items()
                                  if not (slot < len(self.kinds) and self.kinds[slot]))

    def poll(self) -> list[dict[str, Any]]:
        """Read what the files gained; returns the new results whose conversation goes on."""
        self._read_failures()
        for record, _ in self._new_lines(KIND_REJECTED):
            self._mark(slot_of(record), 2)
            self.pending.pop(slot_of(record), None)
        goes_on = []
        for record, offset in self._new_lines(KIND_RESULT):
            slot = slot_of(record)
            self._mark(slot, 1)
            self.pending.pop(slot, None)
            turn, turns = record.get("turn"), record.get("turns")
            if turn is None or turns is None:
                continue
            first = slot - int(turn) + 1
            if int(turn) >= int(turns):
                self._offsets.pop(first, None)  # finished: nothing more is built from it
                continue
            self._offsets.setdefault(first, {})[int(turn)] = offset
            self.pending[slot + 1] = offset
            goes_on.append(record)
        return goes_on

    def history(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """The written results of turns 1..k of the conversation whose turn k is `record`."""
        turn = int(record["turn"])
        offsets = self._offsets.get(slot_of(record) - turn + 1, {})
        missing = [k for k in range(1, turn + 1) if k not in offsets]
        if missing:
            raise ValueError(f"turns {missing} of {record['id']!r} are not in the results")
        return [self.read_at(offsets[k]) for k in range(1, turn + 1)]

    def read_at(self, offset: int) -> dict[str, Any]:
        if self._results is None:
            self._results = self.dir.file(KIND_RESULT).open("rb")
        self._results.seek(offset)
        record: dict[str, Any] = orjson.loads(self._results.readline())
        return record

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None

    def _mark(self, slot: int, code: int) -> None:
        if slot >= len(self.kinds):
            self.kinds.extend(bytes(max(slot + 1 - len(self.kinds), len(self.kinds))))
        if not self.kinds[slot]:
            self.written += 1
            self.kinds[slot] = code

    def _new_lines(self, kind: str) -> list[tuple[dict[str, Any], int]]:
        path = self.dir.file(kind)
        try:
            with path.open("rb") as f:
                f.seek(self._pos[kind])
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[:data.rfind(b"\n") + 1]
        lines, offset = [], self._pos[kind]
        for raw in whole.splitlines(keepends=True):
            lines.append((orjson.loads(raw), offset))
            offset += len(raw)
        self._pos[kind] = offset
        return lines

    def _read_failures(self) -> None:
        """The failures file is rewritten when a retried turn succeeds (the drainer's
        compaction): read it whole whenever it changed, it holds few lines."""
        path = self.dir.file(KIND_FAILURE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.failures.clear()
            return
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self._failures_seen:
            return
        raw = path.read_bytes()
        self._failures_seen = seen
        self.failures = {}
        for line in raw[:raw.rfind(b"\n") + 1].splitlines():
            record = orjson.loads(line)
            self.failures[slot_of(record)] = blocked_by(record)
