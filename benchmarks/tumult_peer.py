"""Tumult Analytics on the Parquet shop data: the ``tumult`` engine of bench_spark.py.

Run by bench_spark.py under the python of Tumult's own venv (``tmlt-analytics`` pins pyspark 3.x,
dpsql's venv has pyspark 4)::

    /work/tmlt-venv/bin/python benchmarks/tumult_peer.py --parquet DIR --rows N --repeats 3

Prints one JSON event per line, as bench_spark.py's own workers do: ``ready`` (session start),
``next`` (a class begins), ``run`` (one answer: its seconds and released values), ``done`` or
``error`` per class, ``unavailable`` if Tumult cannot start. It imports nothing from dpsql.

The same privacy as dpsql's policy in bench_spark.py: the privacy unit is ``user_id``
(``AddRowsWithID``); every query first keeps at most 10 rows per user (``MaxRowsPerID(10)``, as
MAX ROWS PER UNIT 10; one user then moves a count by at most 10, as under dpsql's policy, whose
MAX GROUPS PER UNIT 5 does not lower that bound); amounts are clamped to [0, 500]; each query
costs epsilon 1 in all. The public store keys are a ``KeySet``. For private keys Tumult has no
single query (its automatic partition selection is an experimental flag), so the class runs its
documented two steps: ``get_groups(["zip"])`` at (0.5, 1e-6), then the count over those keys at
0.5 — (1, 1e-6) in all, dpsql's cost for that query. Both steps are timed as one query.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

START = time.perf_counter()
MAX_ROWS, LOWER, UPPER, EPSILON, DELTA = 10, 0.0, 500.0, 1.0, 1e-6


def emit(**event) -> None:
    print(json.dumps(event, default=str), flush=True)


def message(error: Exception) -> str:
    """One line for the report: a Spark error's text ends with its Python or Java exception."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line or "Exception" in line]
    return f"{type(error).__name__}: {(named[-1] if named else lines[0] if lines else '')[:300]}"


def answer_of(frame) -> dict:
    """A released Spark DataFrame as {key: value} (key "" when ungrouped), as bench_spark's."""
    rows = frame.collect()
    return {("" if len(row) == 1 else str(row[0])): (None if row[-1] is None else float(row[-1])) for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parquet", required=True)
    parser.add_argument("--rows", type=int, nargs="+")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--executor-memory", default="4g")
    parser.add_argument("--shuffle-partitions", type=int, default=16)
    parser.add_argument("--queries", nargs="+", required=True)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Tumult's noise runs in Python UDFs: this venv's
    try:
        from pyspark.sql import SparkSession
        from tmlt.analytics import AddRowsWithID, ApproxDPBudget, KeySet, MaxRowsPerID, QueryBuilder, Session

        # The Spark settings bench_spark.py gives dpsql's sessions (spark_config there).
        spark = (SparkSession.builder.master(args.master).appName("tumult-bench")
                 .config("spark.driver.memory", args.driver_memory)
                 .config("spark.executor.memory", args.executor_memory)
                 .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions or 16))  # 0: as before
                 .config("spark.sql.adaptive.enabled", "true")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        parquet = Path(args.parquet)
        visits = spark.read.parquet(str(parquet / "visits.parquet")).select("user_id", "store", "amount", "zip")
        stores = [row[0] for row in spark.read.parquet(str(parquet / "stores.parquet")).select("store").collect()]
        session = Session.from_dataframe(privacy_budget=ApproxDPBudget(float("inf"), 1.0), source_id="visits",
                                         dataframe=visits, protected_change=AddRowsWithID(id_column="user_id"))
    except Exception as error:
        emit(event="unavailable", error=message(error))
        return
    emit(event="ready", seconds=time.perf_counter() - START)

    def bounded():
        return QueryBuilder("visits").enforce(MaxRowsPerID(MAX_ROWS))

    def pure(epsilon: float = EPSILON):
        return ApproxDPBudget(epsilon, 0)

    def private_keys():
        groups = session.evaluate(bounded().get_groups(["zip"]), ApproxDPBudget(EPSILON / 2, DELTA))
        keys = KeySet.from_dataframe(groups)
        return session.evaluate(bounded().groupby(keys).count(), pure(EPSILON / 2))

    classes = {
        "COUNT": lambda: session.evaluate(bounded().count(), pure()),
        "SUM": lambda: session.evaluate(bounded().sum("amount", LOWER, UPPER), pure()),
        "AVG": lambda: session.evaluate(bounded().average("amount", LOWER, UPPER), pure()),
        "GROUP BY public": lambda: session.evaluate(
            bounded().groupby(KeySet.from_dict({"store": stores})).count(), pure()),
        "GROUP BY private": private_keys,
    }
    for name in args.queries:
        emit(event="next", query=name)
        try:
            for run in range(1 + args.repeats):
                start = time.perf_counter()
                answer = answer_of(classes[name]())  # collect(): Spark evaluates lazily
                emit(event="run", query=name, run=run, seconds=time.perf_counter() - start, answer=answer)
            emit(event="done", query=name)
        except Exception as error:
            emit(event="error", query=name, error=message(error))


if __name__ == "__main__":
    main()
