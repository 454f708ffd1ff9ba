# The two commands (README.md):
#   make app    set up .venv and serve the Streamlit explorer on http://localhost:8501 (PORT=...)
#   make test   set up .venv and run the whole test suite, lint included: exactly what CI runs (.ci/run)
# Others (docs/): make demo (the papers' toy results), make experiments (the studies and
# experiments/REPORT.md; how long they take: docs/experiments.md), make test-fast, make test-machines
# (docs/testing.md), make bench, make notebooks.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch is pinned so that a fresh venv on a CPU-only machine takes the local CPU wheel;
# elsewhere pip resolves the same version from the index (CUDA build on Linux GPUs).
TORCH  ?= torch==2.13.0
PORT   ?= 8501

.PHONY: setup browser demo app notebooks experiments experiments-quick test test-fast test-machines bench lint format clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed browser

# The browser test (tests/app/test_browser.py) drives Debian's Chromium through playwright (no browser
# download). Install it when it is missing and we can (root with apt-get); otherwise say so and go on:
# the set-up never fails because of the browser, the test then skips with its reason. apt-get fails
# when another apt holds its lock: then its error is printed and it is retried once, APT_RETRY_WAIT
# seconds later; if that fails too, the error is printed again.
APT_RETRY_WAIT ?= 30
browser:
	@if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the browser test (apt-get, about a minute)"; \
		log=$$(mktemp); ok=0; \
		for try in 1 2; do \
			if ( apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
				--no-install-recommends chromium ) >"$$log" 2>&1; then ok=1; break; fi; \
			if [ $$try = 1 ]; then \
				echo "apt-get failed (another apt may hold its lock); its error:"; \
				tail -n 15 "$$log" | sed 's/^/  apt-get: /'; \
				echo "retrying once in $(APT_RETRY_WAIT) s"; sleep $(APT_RETRY_WAIT); \
			fi; \
		done; \
		if [ $$ok = 0 ]; then \
			echo "chromium could not be installed (the browser test will be skipped); apt-get's error:"; \
			tail -n 15 "$$log" | sed 's/^/  apt-get: /'; \
		else echo "chromium installed"; fi; \
		rm -f "$$log"; \
	else \
		echo "no chromium (and no root apt-get to install it): the browser test will be skipped"; \
	fi

demo: setup
	$(PY) -m toymodel demo

app: setup
	@echo "Cancellation Lab explorer: open http://localhost:$(PORT)  (Ctrl-C stops it)"
	$(PY) -m streamlit run app/main.py --server.port $(PORT) --browser.serverAddress localhost \
		--server.headless true --browser.gatherUsageStats false

# tutorials/*.py (jupytext percent format) -> tutorials/*.ipynb, to open in Jupyter
notebooks: setup
	$(VENV)/bin/jupytext --to notebook tutorials/[0-9][0-9]_*.py

# the papers' predictions tested (toy studies + the language-model study), written to experiments/REPORT.md;
# resumable (finished language-model runs are skipped). experiments-quick: the smallest slice, a few minutes.
experiments: setup
	$(PY) -m experiments

experiments-quick: setup
	$(PY) -m experiments --quick

# the suite on TEST_WORKERS processes (pytest-xdist; --dist loadfile keeps each test file, and so its
# module fixtures such as a built tiny model, on one worker; --no-loadscope-reorder hands the files out
# in the order tests/conftest.py gives them, longest first); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

# the tests marked `sampling` or `exactness` as other machines would run them (other seeds, thread counts,
# AVX2 and no-SIMD kernels): a test that holds only for this CPU's trajectory or summation order fails
# here before it fails in CI.
# Narrow it with ARGS, e.g. make test-machines ARGS='--profiles avx2-seed1 -- -k test_update'.
test-machines: setup
	$(PY) -m tests.machines $(ARGS)

bench: setup
	$(PY) benchmarks/toy_speed.py
	$(PY) benchmarks/app_render.py

lint: setup
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
