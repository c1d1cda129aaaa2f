"""Counting a path's opens in an `strace -f -e trace=open,openat` log: how the tests hold that a
command reads its input once, as the kernel sees it."""

from __future__ import annotations

import re
from pathlib import Path


def opens_of(trace: str, path: Path) -> int:
    """Successful open/openat calls of `path` in an strace -f log."""
    name = re.escape(str(path))
    return len(re.findall(rf'open(?:at)?\([^"]*"{name}",[^)]*\)\s*=\s*\d+', trace))
