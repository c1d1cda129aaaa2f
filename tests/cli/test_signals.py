"""The grace timer of `sigterm_flag`: a command that does not stop in time is interrupted, but
never inside a finalizer (Python swallows that and prints a traceback, and the interrupt is
lost), and never once the command has returned."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, os, signal, sys, time
    from fleetgen.cli import signals

    class Slow:
        def __del__(self):
            time.sleep(0.05)  # the grace timer fires while a finalizer runs

    stop = signals.sigterm_flag(grace_s=0.1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for _ in range(50):
                Slow()
                gc.collect()
    except KeyboardInterrupt:
        print("interrupted outside the finalizer")
        {after}
        sys.exit(0)
    print("never interrupted")
    sys.exit(1)
""")

AFTER_DISARM = """
        stop = signals.sigterm_flag(grace_s=0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        signals.disarm()  # the command returned before its grace ran out
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGTERM)  # a late signal: ignored
        time.sleep(0.1)
        print("no interrupt after disarm")
"""


def _run(after: str) -> subprocess.CompletedProcess[str]:
    after = textwrap.indent(textwrap.dedent(after).strip(), "    ").lstrip()
    return subprocess.run([sys.executable, "-c", SCRIPT.replace("{after}", after)],
                          capture_output=True, text=True, timeout=60)


def test_the_grace_interrupt_never_lands_in_a_finalizer() -> None:
    done = _run("pass")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interrupted outside the finalizer" in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr


def test_no_interrupt_once_the_command_has_returned() -> None:
    done = _run(AFTER_DISARM)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no interrupt after disarm" in done.stdout
    assert "Traceback" not in done.stderr
