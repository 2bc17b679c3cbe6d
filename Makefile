# Set-up and checks. Every target bootstraps .venv itself (idempotent: reinstalls only when
# pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: test demo lint typecheck unit bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel

$(VENV)/.dev: pyproject.toml | $(PY)
	$(PIP) install -q -e '.[dev]'
	touch $@

$(VENV)/.export: pyproject.toml | $(PY)
	$(PIP) install -q -e '.[export]'
	touch $@

$(VENV)/.bench: pyproject.toml | $(PY)
	$(PIP) install -q -e '.[bench]'
	touch $@ $(VENV)/.dev $(VENV)/.export

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .

typecheck: $(VENV)/.dev
	mkdir -p .typecheck/rung
	for d in engines daemon export; do ln -sfn ../../$$d .typecheck/rung/$$d; done
	$(VENV)/bin/mypy

unit: $(VENV)/.dev
	$(PY) -m pytest -q

test: lint typecheck unit

demo: $(VENV)/.export
	$(VENV)/bin/rung demo

bench: $(VENV)/.bench
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
