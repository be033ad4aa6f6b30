# The two commands of the README. Both install what is missing first.
.PHONY: run test setup lint bench clean

VENV ?= .venv
# pytest-xdist processes for make test, each test file kept on one of them. One more than the cores:
# most tests wait on brokerd, Spark or a browser (the suite used ~64% of a core per process at -n 2).
NPROC := $(shell nproc 2>/dev/null || echo 2)
PYTEST_WORKERS ?= $(shell echo $$(( $(NPROC) + 1 )))
PY := $(VENV)/bin/python

setup:
	@./build/setup.sh

run: setup
	$(PY) build/run.py

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: setup
	$(PY) bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var/run
