"""The one poll-with-a-deadline of the tests (never a bare sleep as synchronisation)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(probe: Callable[[], T], timeout_s: float = 5.0, what: str = "a condition", *,
               poll_s: float = 0.02, check: Callable[[], None] | None = None) -> T:
    """Poll `probe` until it returns something truthy and return that; `check` runs before
    each probe (to fail at once, e.g. when a process the wait depends on died). Past the
    deadline: an AssertionError naming `what`, so a slow condition reads as a failed test."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)
