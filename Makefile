# The two commands of the quick start: `make run` and `make test`. Everything else is what they need.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# Both cores: the suite is mostly waiting on databases and child servers.
PYTEST_ARGS ?= -n 2

.PHONY: setup run test lint services browser clean sync-clients config-docs http-docs mutation dist

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

## Install the runtime only (no test tools) and run the server: on the embedded SQLite default and port 8080
## (http://127.0.0.1:8080/docs), or `make run PORT=9000 DATABASE=postgresql://user@host/db`.
PORT ?= 8080
DATABASE ?=
run: $(VENV)/.runtime
	$(BIN)/mainspring serve --port $(PORT)$(if $(DATABASE), --database '$(DATABASE)')

# With PostgreSQL's driver, so that DATABASE=postgresql://… works too.
$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[postgres]'
	touch $@

## Set up (with the test tools), make sure PostgreSQL and NATS are up, lint, and run the whole suite on both engines.
test: setup services browser lint
	$(BIN)/pytest $(PYTEST_ARGS)

# The typed public surface: the clients, the App and what handlers receive, the CLI.
STRICT := src/mainspring/client src/mainspring/__init__.py src/mainspring/app.py src/mainspring/producer.py src/mainspring/worker.py \
	src/mainspring/config.py src/mainspring/interactions/outcomes.py src/mainspring/interactions/models.py \
	src/mainspring/cli.py src/mainspring/core/cli.py src/mainspring/exchange/cli.py src/mainspring/machines/cli.py \
	src/mainspring/interactions/cli.py src/mainspring/batching/cli.py src/mainspring/workflows/cli.py

# The HTTP operations: each handler returns what it declares, since its return type is the answer it sends.
ROUTES := src/mainspring/web src/mainspring/events_and_alerts.py $(wildcard src/mainspring/*/routes.py)

lint: setup
	$(BIN)/lint-imports
	$(BIN)/ruff check src tests scripts bench
	$(BIN)/mypy --strict --follow-imports=silent $(STRICT)
	$(BIN)/mypy --follow-imports=silent --check-untyped-defs --warn-return-any $(ROUTES)
	$(BIN)/python scripts/sync_clients.py --check
	$(BIN)/python scripts/config_docs.py --check
	$(BIN)/python scripts/http_docs.py --check

## Regenerate the sync clients (client/_sync) from the async ones (client/_async).
sync-clients: setup
	$(BIN)/python scripts/sync_clients.py

## Regenerate docs/http.md (the HTTP API reference) from the route table.
http-docs: setup
	$(BIN)/python scripts/http_docs.py

## Regenerate docs/configuration.md from the settings models.
config-docs: setup
	$(BIN)/python scripts/config_docs.py

## A mutation run (cosmic-ray, in a venv of its own) of the modules that keep the guarantees, by hand, never in
## `make test`: `make mutation TARGETS="leasing group"` (all: every target; scripts/mutation.sh --list);
## SAMPLE=N runs a seeded random N of each new target's mutants.
mutation: setup
	scripts/mutation.sh $(if $(SAMPLE),--sample $(SAMPLE)) $(or $(TARGETS),all)

## The wheel and the sdist of this version (mainspring.__version__) in dist/ (DIST=… elsewhere), as a release ships them.
DIST ?= dist
dist: setup
	$(BIN)/python -m build --outdir $(DIST) .

services:
	scripts/ensure-services

## Debian's chromium for the UI's browser tests (installed once, skipped when present).
browser:
	scripts/ensure-browser

clean:
	rm -rf $(VENV) mainspring-data .pytest_cache dist
