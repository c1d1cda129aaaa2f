# Two commands matter: `make demo` and `make test`. Both build .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench flaky clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
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

# Every bench, its figures into bench/figures/*.json (tracked), then the docs' tables from them.
bench: $(STAMP)
	$(BIN)/python -m bench
	$(BIN)/python tools/perf_tables.py

clean:
	rm -rf $(VENV) out bench/results
