"""A small disk for the full-disk tests: a tmpfs of a given size mounted for the test (root
may mount one; elsewhere the test skips, saying why), grown in place once there is to be room,
and the file-size limit (RLIMIT_FSIZE) of this process for EFBIG where no mount is allowed."""

from __future__ import annotations

import resource
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


class SmallDisk:
    def __init__(self, path: Path) -> None:
        self.path = path

    def grow(self, size: str) -> None:
        """More room on the same disk, its files kept: space freed, as a user would."""
        done = _mount("-o", f"remount,size={size}", str(self.path))
        assert done.returncode == 0, done.stderr


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[SmallDisk]:
    """A tmpfs of `size` at `path`, unmounted at the end; a skip where mounting is refused."""
    path.mkdir(parents=True, exist_ok=True)
    done = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): the full-disk test "
                    f"needs root or CAP_SYS_ADMIN")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@contextmanager
def file_size_limit(limit_bytes: int) -> Iterator[None]:
    """This process may write no file past `limit_bytes` (EFBIG: Python ignores SIGXFSZ), for
    the block only."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
