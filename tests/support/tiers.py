"""The test tiers by folder, for tests/conftest.py and the layout test that checks them."""

from __future__ import annotations

# The folders whose tests all start real processes of the product (a LocalFleet, llama.cpp,
# Flower, the demo, the trainers): the slow tier, left out of `make check`. Three carry a
# marker of their own as well (pyproject.toml registers all four). Elsewhere a module is in
# that tier by its own need: `pytestmark = pytest.mark.fleet` where it starts Celery workers
# (tests/workers: the task and the gate in real worker processes, beside the module tests of
# workers/ that need only Valkey; tests/layout/test_test_imports.py holds every module to it).
FLEET_FOLDERS = frozenset({"e2e", "chaos", "ops", "real_engines", "bench", "trainers",
                           "slurm"})
