"""The one rule for tests that need a system package or an executable."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

from fleetgen.settings import envvars

# Set by .ci/run, which installs every system package the suite needs: there a missing one is
# a broken CI image, and a skip would hide it behind a green run.
CI_FLAG = envvars.CI.name


def require_binary(name: str, path: str | None = None, why: str = "") -> str:
    """The path of executable `name` (or of `path`, if given). Missing: a skip on a
    developer's machine, a failure under FLEETGEN_CI=1."""
    found = path if path and os.access(path, os.X_OK) else (None if path else shutil.which(name))
    if found:
        return found
    _missing(path or name, why)


def require_file(path: str, why: str = "") -> str:
    """`path` (a library, a data file of a system package); missing: as `require_binary`."""
    if not os.path.exists(path):
        _missing(path, why)
    return path


def _missing(what: str, why: str) -> NoReturn:
    reason = f"{what} missing{': ' + why if why else ''} (.ci/run installs it)"
    if os.environ.get(CI_FLAG) == "1":
        pytest.fail(f"{reason}; {CI_FLAG}=1 turns this skip into a failure", pytrace=False)
    pytest.skip(reason)
