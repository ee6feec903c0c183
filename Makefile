# novaque's developer commands. `make` alone lists them.
# Every target bootstraps its own virtualenv (.venv) on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
LINTED := $(wildcard novaque tests migrations benchmarks docs/conf.py)

.DEFAULT_GOAL := help
.PHONY: help test test-clean lint docs demo bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP) ## run the suite (PostgreSQL/MySQL too when NOVAQUE_TEST_*_URL are set)
	$(BIN)/pytest -n 2 --dist worksteal $(PYTEST_ARGS)

test-clean: $(STAMP) ## drop the servers' test databases of runs that no longer run
	$(BIN)/python -m tests._testdb

lint: $(STAMP) ## ruff, mypy --strict, and the layering contracts (import-linter)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy
	$(BIN)/lint-imports

docs: $(STAMP) ## the documentation site with the API reference, into docs/_build (warnings fail it)
	$(BIN)/sphinx-build -E -W --keep-going -n -q -b html docs docs/_build/html

demo: $(STAMP) ## live tour: admin UI over a stream of sample orders (SQLite ./novaque.db)
	$(BIN)/novaque demo

bench: $(STAMP) ## run the benchmarks against the raw-SQL floor
	$(BIN)/python -m novaque.cli bench

clean: ## remove the virtualenv and local databases
	rm -rf $(VENV) docs/_build novaque.db novaque.db-wal novaque.db-shm .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
