"""Processes a test's command left behind, found by a mark in their environment: every child,
grandchild and engine inherits it, whatever process group or session it moved to."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

MARK_VAR = "SURVIVOR_MARK"


def new_mark() -> dict[str, str]:
    """The environment entry to give the command under test."""
    return {MARK_VAR: uuid.uuid4().hex}


def marked(mark: dict[str, str]) -> list[str]:
    """`pid cmdline` of every live process (not a zombie) that carries `mark`."""
    needle = f"{MARK_VAR}={mark[MARK_VAR]}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z":
            found.append(f"{proc.name} {cmdline.strip()}")
    return found


def _live(proc: Path) -> tuple[int, str] | None:
    """(process group, cmdline) of a live process, None for a zombie or one gone."""
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return None if fields[0] == "Z" else (int(fields[2]), cmdline.strip())


def by_cmdline_or_group(needles: list[str], pgids: set[int]) -> list[str]:
    """`pid cmdline` of every live process whose cmdline holds one of `needles` or that is in
    one of the process groups `pgids`. For children that lose the environment mark: vLLM's
    engine core renames itself (setproctitle, `VLLM::EngineCore`), which overwrites the memory
    /proc/PID/environ reads, so only its group (or its name) still says whose it is."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        live = _live(proc)
        if live is not None and (live[0] in pgids or any(n in live[1] for n in needles)):
            found.append(f"{proc.name} {live[1]}")
    return found
