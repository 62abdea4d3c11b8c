# The README's two commands: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-spark bench clean

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
# pytest runs on PYTEST_WORKERS processes (CI has two cores); --dist loadgroup keeps any spark
# tests on one of them, so one Spark session serves them all. PYTEST_ARGS adds options:
# `make test PYTEST_ARGS='-m "not slow and not spark"'` also leaves out the slowest tests.
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=
test: $(VENV)/.installed-test
	$(BIN)/ruff check dpsql
	$(BIN)/mypy dpsql
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The Spark backend's tests (local[2]; Java 17): the engine, its types, its semantics against
# DuckDB's, and the corpus on both engines. DPSQL_SPARK_FULL=1 runs the whole corpus.
test-spark: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m spark -p no:cacheprovider

# Issue 26's speed figures against raw DuckDB (benchmarks/bench_speed.py), then bench_scale.py --all
# (peers, noise, utility). BENCH_ARGS adds options: `make bench BENCH_ARGS='--quick'` (~3 minutes),
# `--with-100m`, `--before /path/to/older/checkout` (a before column from the same run).
# Then bench-scale: issue 38's other targets, each printed beside its figure.
BENCH_ARGS ?=
bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_speed.py --all $(BENCH_ARGS)
	$(MAKE) bench-scale

# Issue 38 (scale), one item after another, each benchmark printing its targets beside its figures:
# where a fresh text's milliseconds go (item 2), Spark's stages at 1M rows on local[2] and
# `dpsql serve`'s start-up on Spark (item 3), the copy's build, peak memory and a stored copy's
# reuse at 10M rows (item 4; `--rows 100000000` by hand), and db.fit at 10M beside diffprivlib
# (item 5). The server's figures (item 1) are in bench_speed.py's report above.
.PHONY: bench-scale
bench-scale: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_fresh_stages.py --cpu
	$(BIN)/python benchmarks/bench_grouped_parts.py
	$(BIN)/python benchmarks/bench_spark_stages.py --rows 1000000 --serve
	$(BIN)/python benchmarks/bench_billion.py --rows 10000000 --memory-limit 8GB --spill-limit 4GB
	$(MAKE) bench-models BENCH_ARGS='--sizes 10M --repeats 1'

# Issue 38 item 5: db.fit at 1M and 10M rows beside diffprivlib, before and after, each with its
# target (benchmarks/bench_models.py --timing; `BENCH_ARGS='--sizes 10M --repeats 1'`).
.PHONY: bench-models
bench-models: $(VENV)/.installed-test
	$(BIN)/python -m pip install --quiet -e '.[models-bench,flights]'
	$(BIN)/python benchmarks/bench_models.py --timing $(BENCH_ARGS)

# dpsql on Spark against dpsql on DuckDB and Tumult Analytics (its own venv, made on first use).
.PHONY: bench-spark
bench-spark: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_spark.py

clean:
	rm -rf $(VENV) build dist *.egg-info
