# The two commands a newcomer needs: `make run` and `make test` (README).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
TEST_INSTALLED := $(VENV)/.installed-test
WORKER_INSTALLED := $(VENV)/.installed-worker

.PHONY: run run-worker test test-fast migrate lint bench bench-metrics bench-runtime clean

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

$(WORKER_INSTALLED): $(INSTALLED)
	$(BIN)/pip install --quiet -e '.[worker]'
	touch $@

## Start the runtime worker here (W1). Defaults for local use: socket instance/worker.sock, models
## under instance/artifacts (model paths in jobs are relative to it), accelerator auto; set
## MODELFORGE_WORKER_SOCKET, MODELFORGE_WORKER_ARTIFACT_DIR or MODELFORGE_WORKER_ACCELERATOR_MODE to
## change them. The first run compiles llama-cpp-python (about 5 minutes; pip caches the wheel).
run-worker: $(WORKER_INSTALLED)
	mkdir -p "$${MODELFORGE_WORKER_ARTIFACT_DIR:-instance/artifacts}"
	MODELFORGE_WORKER_SOCKET="$${MODELFORGE_WORKER_SOCKET:-instance/worker.sock}" \
	MODELFORGE_WORKER_ARTIFACT_DIR="$${MODELFORGE_WORKER_ARTIFACT_DIR:-instance/artifacts}" \
	exec $(BIN)/python -m modelforge_runtime_worker

# Parallel workers for the suite (pytest-xdist). Most tests wait on processes more than they
# compute, so more workers than this box's two cores pays; `PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= 4

## Install the test extra and run the whole suite: every tier, on SQLite and PostgreSQL (CI).
test: $(TEST_INSTALLED)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

## The inner loop: the unit tier on SQLite only, less its `slow` property tests (about 80 s here). Run it after each change;
## run `make test` before a commit lands (docs/testing.md says which tier a test goes in).
test-fast: $(TEST_INSTALLED)
	$(BIN)/python -m pytest tests/unit --sqlite-only -m 'not slow' -n $(PYTEST_FAST_WORKERS) $(PYTEST_ARGS)
PYTEST_FAST_WORKERS ?= 2

lint: $(TEST_INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## Benchmarks print figures; docs/benchmarks.md says what each measures and its latest figures.
bench: $(TEST_INSTALLED)
	$(BIN)/python bench/heartbeat.py

## GET /metrics at 1,000 nodes x 8 GPUs on SQLite, and PostgreSQL when MODELFORGE_TEST_POSTGRES_URL is set (O1).
bench-metrics: $(TEST_INSTALLED)
	$(BIN)/python bench/metrics.py $(BENCH_ARGS)

## The runtime worker's benchmark through its socket against llama-cpp-python in-process (W2).
bench-runtime: $(TEST_INSTALLED)
	$(BIN)/python bench/runtime.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
