# Two entry points for a fresh machine (see README.md): `make serve` and `make test`.
# Both create .venv and install what they need; re-running them is cheap.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip

.PHONY: serve test lint install-serve install-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# The local extra builds llama-cpp-python from source once (~8-15 min on 2 cores; pip caches the wheel).
install-serve: $(BIN)/python
	$(PIP) install --quiet -e '.[local]'

install-dev: $(BIN)/python
	$(PIP) install --quiet -e '.[local,dev,bench]'

serve: install-serve
	$(BIN)/pointsman serve $(ARGS)

lint: install-dev
	$(BIN)/ruff check gateway policies classifiers evals store tests bench
	$(BIN)/mypy
	bash docker/lint.sh

test: install-dev lint
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)
