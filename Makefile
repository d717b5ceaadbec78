# The two commands a newcomer needs: `make run` and `make test` (README).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
TEST_INSTALLED := $(VENV)/.installed-test

.PHONY: run test migrate lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(INSTALLED): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(TEST_INSTALLED): $(INSTALLED)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

## Set up and start the control plane on SQLite (gunicorn on $MODELFORGE_BIND, default 127.0.0.1:8000).
run: migrate
	exec $(BIN)/gunicorn -c python:app.gunicorn_conf wsgi:app

## Generate instance secrets once and bring the database schema up to date.
migrate: $(INSTALLED)
	$(BIN)/python -m app.instance
	$(BIN)/flask --app wsgi db upgrade

## Install the test extra and run the whole suite.
test: $(TEST_INSTALLED)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(TEST_INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## Benchmarks print figures; see README.
bench: $(TEST_INSTALLED)
	$(BIN)/python bench/heartbeat.py

clean:
	rm -rf $(VENV) .pytest_cache
