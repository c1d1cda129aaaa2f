"""The trainers tier: SpecForge's and speculators' own data code run on fleetgen's exports of
real CLI runs (tests/support/trainer_judge.py); the render endpoint speculators asks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.httpd import serving
from tests.support.trainer_judge import Render


@pytest.fixture(scope="module")
def render_endpoint() -> Iterator[str]:
    with serving(Render) as url:
        yield url
