"""A full disk, said once where it is met: the OS's ENOSPC, EDQUOT and EFBIG on the output files
and Redis's MISCONF (it could not write its append-only file or snapshot) become one DiskFull
naming the path that is full and what to do."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

import redis

from fleetgen.errors import DiskFull

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
RESUME = "then run the same command to resume (nothing unwritten was acknowledged)"


def from_os_error(error: OSError, path: Path | str | None = None) -> DiskFull | None:
    """The DiskFull that `error` (met writing `path`) is, or None if it is another error."""
    where = Path(path or error.filename or ".")
    if error.errno in FULL_ERRNOS:
        return DiskFull(f"no space left on the disk of {where} ({free_of(where)}); free "
                        f"space there, {RESUME}")
    if error.errno == errno.EFBIG:
        return DiskFull(f"{where} reached the file-size limit ({size_limit()}); raise it "
                        f"(`ulimit -f`), {RESUME}")
    return None


def from_redis_error(error: redis.ResponseError, data_dir: Path | None) -> DiskFull | None:
    """The DiskFull that a Redis reply is (MISCONF: it cannot persist, most often a full
    disk), or None. `data_dir`: where the embedded Valkey keeps its data (None: the user's
    own Redis, whose disk is on its own host)."""
    # A pipeline's error names its command first ("Command # 1 (LPUSH ...) of pipeline
    # caused error: MISCONF ..."): the producer's first batches are pipelines.
    _, misconf, rest = str(error).partition("MISCONF")
    if not misconf:
        return None
    cause = rest.strip().split(". ")[0]
    if data_dir is None:
        return DiskFull(f"Redis cannot write to its disk ({cause}); free space on the Redis "
                        f"host (its `dir`), {RESUME}")
    # No free space in the line: Valkey cuts its failed write back, so the disk shows room
    # that the write it needed did not find.
    return DiskFull(f"the run's Valkey cannot write its data in {data_dir} ({cause}); free "
                    f"space on that disk, {RESUME}")


def free_of(path: Path) -> str:
    """How much room the disk of `path` (or of its nearest existing parent) has, in words."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return "its free space unknown"
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return f"{_size(free)} free of {_size(size)}"


def size_limit() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{_size(soft)} a file"


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
