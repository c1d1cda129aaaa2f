"""The CLI on a terminal: progress bars on, and still a clean run (tests run without a TTY
otherwise, which would hide anything only a person at a terminal sees)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import redis

from fleetgen.queue.contract import QUEUE


def run_on_tty(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    leader, follower = pty.openpty()
    # A new pty is 0 x 0; a real terminal is not (tqdm draws nothing in 0 columns).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower,
                            env={**os.environ, **env}, close_fds=True)
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace")


def test_produce_on_a_terminal_shows_progress(redis_url: str, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "t{i}", "prompt": "q {i}"}}\n' for i in range(50)))
    code, screen = run_on_tty([sys.executable, "-m", "fleetgen", "produce", str(prompts),
                               "--run", "tty", "--context-length", "4096", "--no-wait"],
                              {"FLEETGEN_REDIS_URL": redis_url})
    assert code == 0, screen
    assert "Traceback" not in screen
    assert "50/50" in screen  # the bar knew its total
    assert "50 rows read, 50 enqueued" in screen
    assert redis.Redis.from_url(redis_url).llen(QUEUE) == 50
