"""The grace timer of `sigterm_flag`: a command that does not stop in time is interrupted, but
never inside a finalizer (Python swallows that and prints a traceback, and the interrupt is
lost), and never once the command has returned."""

from __future__ import annotations

import subprocess
import sys
import textwrap

FINALIZER = textwrap.dedent("""
    import os, signal, sys, time
    from fleetgen.cli import signals

    landed = []  # for each late signal: did it arrive inside a finalizer?
    real = signals._in_finalizer
    def spy(frame):
        landed.append(real(frame))
        return landed[-1]
    signals._in_finalizer = spy

    class Slow:
        def __del__(self):
            time.sleep(0.4)  # past the 0.1 s grace: the timer fires in here

    stop = signals.sigterm_flag(grace_s=0.1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop()
    try:
        Slow()  # freed at once: its finalizer runs now
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.01)
    except KeyboardInterrupt:
        print("interrupted", landed)
        sys.exit(0 if landed[0] and not landed[-1] else 2)
    print("never interrupted", landed)
    sys.exit(1)
""")

DISARMED = textwrap.dedent("""
    import os, signal, time
    from fleetgen.cli import signals

    stop = signals.sigterm_flag(grace_s=0.1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop()
    signals.disarm()  # the command returned before its grace ran out
    time.sleep(0.5)  # the grace timer would have fired here
    os.kill(os.getpid(), signal.SIGTERM)  # a late signal: ignored
    time.sleep(0.1)
    print("no interrupt after disarm")
""")


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)


def test_the_grace_interrupt_never_lands_in_a_finalizer() -> None:
    done = _run(FINALIZER)
    # The fault landed (the first late signal came inside the finalizer, which deferred it)
    # and the interrupt still came, outside it.
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr


def test_no_interrupt_once_the_command_has_returned() -> None:
    done = _run(DISARMED)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no interrupt after disarm" in done.stdout
    assert "Traceback" not in done.stderr
