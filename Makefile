# Two commands do all the set-up on a machine with Python >= 3.10 and pip:
#   make test   creates .venv on first use, installs the lab, runs the suite (the slow tier
#               of whole-model compiles and process starts: make test-slow; both: make test-all)
#   make run    creates .venv if needed and runs the lab's main job
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# xdist's work stealing: a worker that runs out takes tests from the other's queue, so neither
# sits idle behind the other's long whole-model checks (docs/testing.md)
XDIST  := -n 2 --dist worksteal
STAMP  := $(VENV)/.installed

.PHONY: test test-alt test-slow test-all run checks bench peers clean docs deps-newest

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slow"

test-alt: $(STAMP)      # the fast suite under a second numerical configuration (docs/testing.md)
	$(PY) scripts/alt_numerics.py -- $(PY) -m pytest -q $(XDIST) -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m slow

test-all: $(STAMP)
	$(PY) -m pytest -q $(XDIST)

run: $(STAMP)
	$(PY) -m checks
	$(PY) -m experiments all

checks: $(STAMP)
	$(PY) -m checks

clean:
	rm -rf $(VENV) results .pytest_cache

deps-newest: $(STAMP)   # the newest releases of every dependency in a scratch venv: what changed
	$(PY) scripts/try_newest.py

docs: $(STAMP)          # the example output in README.md and docs/, recomputed
	$(PY) -m checks docs

bench: $(STAMP)
	$(PY) -m experiments bench

# PyTorch for the bench's peers and the checker-cost's gradcheck: the tested CPU build
# (constraints.txt pins torch's +cpu build, which PyPI does not serve: PyTorch publishes its
# CPU builds on its own index)
peers: $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e ".[peers]" \
		--extra-index-url https://download.pytorch.org/whl/cpu
