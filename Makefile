# Two commands for a fresh machine (see README.md):
#   make demo   set up .venv and print the paper's toy results
#   make test   set up .venv and run the whole test suite (lint included)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch is pinned so that a fresh venv on a CPU-only machine takes the local CPU wheel;
# elsewhere pip resolves the same version from the index (CUDA build on Linux GPUs).
TORCH  ?= torch==2.13.0

.PHONY: setup demo test test-fast bench lint format clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) -m toymodel demo

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) benchmarks/toy_speed.py

lint: setup
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
