# The two commands of the README. Both install what is missing first.
.PHONY: run test setup lint bench clean

VENV ?= .venv
# pytest-xdist processes for make test (auto: one per core), each test file kept on one of them,
# the files that take longest handed out first (tests/filetimes.py; --no-loadscope-reorder keeps that order).
# One process more than the cores: the suite's tests mostly wait (brokers, JVMs, browsers), and on this
# 2-core machine 3 processes ran it in 14.3 and 14.6 min (two clean runs, 2026-11-26) where 2 took 16.0.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
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
