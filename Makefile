# The two commands of the README. Both install what is missing first.
.PHONY: run test setup lint bench clean

VENV ?= .venv
# pytest-xdist processes for make test (auto: one per core), each test file kept on one of them,
# the files that take longest handed out first (tests/filetimes.py; --no-loadscope-reorder keeps that order).
# Two processes more than the cores: the suite's tests mostly wait (brokers, JVMs, browsers; 14 min of
# CPU in 16 of wall time on 3 processes), and on this 2-core machine 4 processes ran it in 13.3 min
# where 3 took 16.2 (same commit and machine, 2026-11-29; 2 took 16.0 when the suite was smaller).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 2 )))
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
