# The two commands of the quick start: `make run` and `make test`. Everything else is what they need.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# Both cores: the suite is mostly waiting on databases and child servers.
PYTEST_ARGS ?= -n 2

.PHONY: setup run test lint services browser clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

## Set up and run the server on the embedded SQLite default (http://127.0.0.1:8080/docs).
run: setup
	$(BIN)/mainspring serve

## Set up, make sure PostgreSQL and NATS are up, lint, and run the whole suite on both engines.
test: setup services browser lint
	$(BIN)/pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check src tests

services:
	scripts/ensure-services

## Debian's chromium for the UI's browser tests (installed once, skipped when present).
browser:
	scripts/ensure-browser

clean:
	rm -rf $(VENV) mainspring-data .pytest_cache
