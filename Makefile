# The README's two commands: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

demo: $(VENV)/.installed
	$(BIN)/dpsql demo

# Lint and type checks first: a failure there is cheaper to read than a failing test.
test: $(VENV)/.installed-test
	$(BIN)/ruff check dpsql
	$(BIN)/mypy dpsql
	$(BIN)/python -m pytest

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_scale.py --all

# dpsql on Spark against dpsql on DuckDB and Tumult Analytics (its own venv, made on first use).
.PHONY: bench-spark
bench-spark: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_spark.py

clean:
	rm -rf $(VENV) build dist *.egg-info
