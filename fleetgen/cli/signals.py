"""SIGTERM for the commands that run long (produce, drain, status --watch, the demo): a flag
they look at between two steps, and a deadline after which it interrupts them."""

from __future__ import annotations

import atexit
import signal
import threading
from collections.abc import Callable


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

    def on_sigterm(signum: int, frame: object) -> None:
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()
        # A real signal, not a flag: it interrupts the blocking system call (PEP 475 would
        # otherwise resume it), and this handler then raises out of it.
        timer = threading.Timer(grace_s, signal.pthread_kill, (main, signal.SIGTERM))
        timer.daemon = True
        timer.start()
        atexit.register(timer.cancel)  # a command that returned in time exits in peace

    for signum in signums:
        signal.signal(signum, on_sigterm)
    return flag.is_set
