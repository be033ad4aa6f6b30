# The two commands of the README. Both install what is missing first.
.PHONY: run test setup lint bench clean

VENV ?= .venv
# pytest-xdist processes for make test (auto: one per core), each test file kept on one of them,
# the files that take longest handed out first (tests/filetimes.py; --no-loadscope-reorder keeps that order).
# (One more than the cores ran the suite in 13.7 min instead of ~17 here, but the Spark/Celery and
# HBase-double tests then failed on timing in 2 runs of 2: not yet.)
PYTEST_WORKERS ?= auto
PY := $(VENV)/bin/python

setup:
	@./build/setup.sh

run: setup
	$(PY) build/run.py

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: setup
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var/run
