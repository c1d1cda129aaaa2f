"""Producer tests read a server's limits from small simulated answers."""

from __future__ import annotations

import pytest

from tests.support.sim import StartSim


@pytest.fixture
def start_sim(start_sim: StartSim) -> StartSim:
    """The suite's simulated servers, with short answers unless a test says otherwise."""
    return lambda **overrides: start_sim(**{"output_tokens_mean": 8, **overrides})
