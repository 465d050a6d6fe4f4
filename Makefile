# One entry point for newcomers and CI. `make test` builds its own virtualenv.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv run test lint typecheck check bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## Main job on the embedded default: a local nameserver + broker, no Kubernetes.
run: $(STAMP)
	$(VENV)/bin/rmq-local up examples/brokergroup.yaml

## The whole test suite (lint and type checks first: they are part of the contract).
test: $(STAMP)
	$(VENV)/bin/ruff check broker operator tests bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check broker operator tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/send_bench.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
