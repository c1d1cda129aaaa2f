"""SIGTERM for the commands that run long (produce, drain, status --watch, the demo): a flag
they look at between two steps, and a deadline after which it interrupts them."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

# The grace timers of every flag, and whether the command has returned: once it has, a late
# timer must not raise into its exit (the finally blocks, the summary, the interpreter's
# teardown), which is why `disarm` runs as the command's handler returns.
_TIMERS: list[threading.Timer] = []
_disarmed = threading.Event()


class Stopped(KeyboardInterrupt):
    """A stop by Ctrl-C or SIGTERM that the command has already told the user about (how to
    resume, what is kept): `main` exits 130 without a line of its own."""


def sigterm_flag(grace_s: float = 1.0,
                 signums: tuple[int, ...] = (signal.SIGTERM,)) -> Callable[[], bool]:
    """A `should_stop` that turns true on SIGTERM, so a command stops between two batches
    with nothing half-done. Only the main thread may install a handler; elsewhere (the demo
    runs the producer in a thread) it never turns true and the caller stops it otherwise.

    A command blocked where it cannot look at the flag (a Redis call riding out an outage
    retries for about 30 s) must not hold the signal hostage: `grace_s` after the first
    SIGTERM, or at a second one, the handler raises KeyboardInterrupt in the main thread, so
    the command exits 130 within seconds. That is no worse than a SIGKILL, which every
    command survives (a torn line is cut, an unacked entry is read again).

    `signums`: the signals that set the flag (the demo: SIGINT too, so Ctrl-C stops it the
    same way, with its summary written)."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return flag.is_set
    main = threading.main_thread().ident
    assert main is not None
    _disarmed.clear()  # a new command in this process (tests run several): armed again

    def interrupt_after(delay_s: float) -> None:
        # A real signal, not a flag: it interrupts the blocking system call (PEP 475 would
        # otherwise resume it), and this handler then raises out of it.
        timer = threading.Timer(delay_s, signal.pthread_kill, (main, signal.SIGTERM))
        timer.daemon = True
        timer.start()
        _TIMERS.append(timer)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if _disarmed.is_set():
            return  # the command has returned: its own exit path is under way
        if flag.is_set():
            if _in_finalizer(frame):
                # Python swallows what a finalizer raises (and prints it as a traceback), so
                # the interrupt would be lost: try again a moment later, outside it.
                interrupt_after(0.05)
                return
            raise KeyboardInterrupt
        flag.set()
        interrupt_after(grace_s)

    for signum in signums:
        signal.signal(signum, on_sigterm)
    return flag.is_set


def disarm() -> None:
    """The command has returned: cancel every grace timer; a signal from now on is ignored
    by the handlers (the process is on its way out, nothing is left to interrupt)."""
    _disarmed.set()
    for timer in _TIMERS:
        timer.cancel()
    _TIMERS.clear()


def _in_finalizer(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def shield_from_signals() -> None:
    """From here on the command only writes what it has and stops what it started, each step
    bounded (a worker gets half a second, then SIGKILL): neither another signal nor the
    handler's grace timer may interrupt that half-way and leave processes behind."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
