"""Neighbouring databases for the adversarial tests: shop-like data with and without a target.

The target (user_id ``TARGET``) is a worst case for every bound dpsql enforces: more rows than
MAX ROWS PER UNIT, amounts far outside the bounds (and NaN, +-inf, NULL, -0.0), a store key
nobody else has, a zip code of its own and a long string. ``outcome`` runs one query on a
fresh connection and reduces what the analyst sees to comparable facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

import dpsql
from dpsql.mechanisms.noise import SeededSource

TARGET = 42424
"""The privacy unit whose presence the attacks try to detect."""

POLICY = """
BUDGET EPSILON 10 DELTA 1e-3;
QUERY EPSILON 0.5;
PRIVATE TABLE visits (
    PRIVACY UNIT user_id,
    MAX ROWS PER UNIT 5,
    MAX GROUPS PER UNIT 3,
    amount BOUNDS 0 TO 500,
    age BOUNDS 18 TO 90,
    store KEYS FROM stores.store
);
PUBLIC TABLE stores;
"""
"""Policy of the adversarial databases (``secrets`` exists but is not declared)."""

STORES = ("north", "south", "east", "west")


def visits(target: bool, users: int = 60, seed: int = 0, target_rows: int = 12) -> pd.DataFrame:
    """The private table: ``users`` ordinary users with 1-4 visits, plus the target if asked."""
    rng = np.random.default_rng(seed)
    rows = []
    for user in range(1, users + 1):
        for _ in range(int(rng.integers(1, 5))):
            rows.append((user, STORES[int(rng.integers(0, 4))], float(rng.integers(0, 500)),
                         int(rng.integers(18, 91)), f"z{user % 7}", "ordinary note"))
    if target:
        extremes = [1e12, -1e12, math.nan, math.inf, -math.inf, None, -0.0, 5e-324, 500.5, 1.0]
        for i in range(target_rows):
            rows.append((TARGET, "zzz-only-42424" if i % 2 else STORES[0], extremes[i % len(extremes)],
                         200 if i % 3 else 17, "target-zip", "a" * 5000))
    frame = pd.DataFrame(rows, columns=["user_id", "store", "amount", "age", "zip", "note"])
    return frame.astype({"user_id": "int64", "amount": "float64", "age": "int64"})


def frames(target: bool, **kwargs) -> dict[str, pd.DataFrame]:
    """Every table of one neighbour: visits, the public stores, an undeclared secrets table."""
    return {
        "visits": visits(target, **kwargs),
        "stores": pd.DataFrame({"store": list(STORES), "city": ["a", "b", "b", "c"]}),
        "secrets": pd.DataFrame({"user_id": [TARGET], "password": ["hunter2"]}),
    }


@dataclass(frozen=True)
class Outcome:
    """What one run showed the analyst, reduced to what must not depend on the target."""

    kind: str
    """'answer', or the class name of the error raised."""
    message: str
    """The error message ('' for an answer)."""
    spent: Fraction
    """Epsilon charged by the run."""
    rows: int
    """Rows released (0 for an error)."""
    result: object = None
    """The DPResult, for answers."""


def run(db, sql: str, **options) -> Outcome:
    """Run ``sql`` on ``db``; what the analyst saw, and the epsilon that this run charged.

    A non-DPError is reported as ``crash:<class>``, an outcome no test expects."""
    before = db.budget.spent.epsilon
    try:
        result = db.sql(sql, **options)
    except dpsql.DPError as error:
        return Outcome(type(error).__name__, str(error), db.budget.spent.epsilon - before, 0)
    except Exception as error:  # noqa: BLE001 - a crash is an outcome the tests reject
        return Outcome(f"crash:{type(error).__name__}", str(error)[:200], db.budget.spent.epsilon - before, 0)
    return Outcome("answer", "", db.budget.spent.epsilon - before, len(result.fetchall()), result)


def outcome(sql: str, target: bool, seed: int = 1, policy: str = POLICY, data: dict | None = None,
            **options) -> Outcome:
    """Run ``sql`` on a fresh connection to one neighbour."""
    with dpsql.connect(data if data is not None else frames(target), policy=policy,
                       rng=SeededSource(seed)) as db:
        return run(db, sql, **options)


def neighbours(seed: int = 1, budget: str = "100000", engine: str = "duckdb") -> dict[bool, "dpsql.Connection"]:
    """Two long-lived connections, {True: with the target, False: without}, sharing a policy
    whose budget is large enough for a whole test module (each run reports its own charge).

    On ``engine`` "spark" each neighbour's tables are temporary views of a session of its own
    (``newSession()`` of the shared test session: the same names, different rows)."""
    policy = POLICY.replace("BUDGET EPSILON 10", f"BUDGET EPSILON {budget}")
    if engine == "spark":
        return {target: dpsql.connect(spark_session_with(frames(target)), policy=policy, rng=SeededSource(seed),
                                      ledger=":memory:")
                for target in (True, False)}
    return {target: dpsql.connect(frames(target), policy=policy, rng=SeededSource(seed))
            for target in (True, False)}


def spark_session_with(data: dict[str, pd.DataFrame]):
    """A new session of the shared local Spark (``tests/spark.py``) whose temporary views are
    ``data``'s tables, as ``tests/engines.Engine.load`` makes them (through Parquet, each column of
    the Spark type of its DuckDB type)."""
    import tempfile

    import duckdb
    from spark import session

    from dpsql.backends.spark.types import spark_type

    spark = session().newSession()
    directory = tempfile.mkdtemp(prefix="dpsql-adversary-")
    with duckdb.connect() as con:
        for name, frame in data.items():
            con.register("dp_frame", frame)
            columns = con.execute("DESCRIBE SELECT * FROM dp_frame").fetchall()
            path = f"{directory}/{name}.parquet"
            con.execute(f"COPY (SELECT * FROM dp_frame) TO '{path}' (FORMAT PARQUET)")
            con.unregister("dp_frame")
            listed = ", ".join(f"CAST(`{c[0]}` AS {spark_type(c[1])}) AS `{c[0]}`" for c in columns)
            spark.read.parquet(path).createOrReplaceTempView("dp_test_raw")
            spark.sql(f"SELECT {listed} FROM dp_test_raw").createOrReplaceTempView(name)
            spark.catalog.dropTempView("dp_test_raw")
    return spark
