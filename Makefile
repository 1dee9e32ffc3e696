# `make demo` and `make test` are the README quick start: each sets up .venv itself.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.bebop-installed

.PHONY: setup demo test bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the local CPU wheel (an unpinned torch pulls a multi-GB CUDA build).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[app,notebooks,dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/bebop demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -rs

bench: $(STAMP)
	$(BIN)/bebop bench losses
	$(BIN)/bebop bench engine

clean:
	rm -rf $(VENV) runs .pytest_cache
