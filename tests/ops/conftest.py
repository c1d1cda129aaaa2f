"""Ops tests: fleets started the way an operator starts them (honcho, namespaces, Flower)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

_ARTIFACTS: list[str] = []


@pytest.fixture()
def artifact() -> Callable[[str], None]:
    """Record a file a human should look at (a screenshot); listed at the end of the run."""

    def record(line: str) -> None:
        _ARTIFACTS.append(line)
        print(line)

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _ARTIFACTS:
        terminalreporter.section("ops artifacts")
        for line in _ARTIFACTS:
            terminalreporter.write_line(line)
