"""Spark answering interactively (issue 38): the copy laid out by unit, shuffles sized by dpsql
where the session's owner left them, nothing read at connect, one job per query, and ``let``
written inline only where that computes what binding the value once does."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from sqlglot import exp

import dpsql
from dpsql.backends.spark.rewrites import Writer, _first_evaluated
from tests.engines import Engine

POLICY = """BUDGET EPSILON 100; QUERY EPSILON 1;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, MAX GROUPS PER UNIT 2,
  x BOUNDS 0 TO 10, g KEYS ('a', 'b', 'c'));"""


def _frame(rows: int = 400, units: int = 50) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    return pd.DataFrame({"uid": rng.integers(0, units, rows), "g": rng.choice(["a", "b", "c"], rows),
                         "x": np.round(rng.normal(5, 2, rows), 3)})


@pytest.fixture
def spark_engine():
    opened = Engine("spark")
    yield opened
    opened.close()


def _jobs(spark, action) -> int:
    context = spark.sparkContext
    context.setJobGroup("dpsql-layout-test", "counted")
    try:
        action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return len(context.statusTracker().getJobIdsForGroup("dpsql-layout-test"))


@pytest.mark.spark
@pytest.mark.spark_ci
@pytest.mark.xdist_group("spark")
def test_connect_reads_no_row_and_a_query_over_the_built_copy_is_one_job_with_no_shuffle_by_unit(spark_engine):
    spark = spark_engine.load({"t": _frame()})
    # eager_bounding (what `dpsql serve` opens with) reads nothing on Spark: the first query builds.
    db = dpsql.connect(spark, policy=POLICY, ledger=":memory:", eager_bounding=True)
    try:
        assert _jobs(spark, lambda: None) == 0
        assert not spark.catalog.isCached("dp_bounded_t__uid__3")
        db.sql("SELECT COUNT(*) AS n FROM t").fetchall()  # builds the copy
        assert spark.catalog.isCached("dp_bounded_t__uid__3")
        # (another epsilon: the same query at the same epsilon is answered again from the ledger)
        assert _jobs(spark, lambda: db.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.5).fetchall()) == 1
        # The per-unit limit's window reads the copy partitioned by the unit: no shuffle by it.
        copy = spark.table("dp_bounded_t__uid__3")
        plan = spark.sql("SELECT uid, g, dense_rank() OVER (PARTITION BY uid ORDER BY g) AS r "
                         "FROM dp_bounded_t__uid__3")._jdf.queryExecution().executedPlan().toString()
        assert "Exchange" not in plan.split("InMemoryRelation")[0], plan
        assert copy.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism
    finally:
        db.close()


@pytest.mark.spark
@pytest.mark.xdist_group("spark")
def test_the_row_count_table_read_from_the_copy_counts_every_raw_row_up_to_its_cap(spark_engine):
    """``raw_rows_select`` reads the copy's ``dp_raw_rows``: each kept unit's raw row count (not
    the rows the copy keeps), capped at ``raw_rows_cap``, and only units the copy keeps."""
    from dpsql.backends.bounding import raw_rows_cap

    counts = {1: 1, 2: 3, 3: 4, 4: raw_rows_cap(3) + 5}
    units = [unit for unit, n in counts.items() for _ in range(n)] + [None]
    frame = pd.DataFrame({"uid": pd.array(units, dtype="Int64"),
                          "g": "a", "x": 1.0})
    spark = spark_engine.load({"t": frame})
    db = dpsql.connect(spark, policy=POLICY, ledger=":memory:")
    try:
        db.sql("SELECT COUNT(*) AS n FROM t").fetchall()
        raw = dict(spark.sql("SELECT dp_unit, r FROM dp_raw_rows_dp_bounded_t__uid__3").collect())
        assert raw == {1: 1, 2: 3, 3: 4, 4: raw_rows_cap(3)}
    finally:
        db.close()


def test_the_value_spark_reads_first_is_found_through_cases_and_calls():
    v, w = exp.column("v"), exp.column("w")
    rounds_to_zero = exp.EQ(this=exp.Round(this=v.copy()), expression=exp.Literal.number(0))
    first = _first_evaluated(exp.Case(ifs=[exp.If(this=rounds_to_zero, true=w.copy())], default=v.copy()))
    assert first.name == "v"
    assert _first_evaluated(exp.Add(this=exp.Literal.number(1), expression=w.copy())).name == "w"
    assert _first_evaluated(exp.Literal.number(1)) is None
    # A CASE whose first condition is constant: what it reads first is not plain to see.
    case = exp.Case(ifs=[exp.If(this=exp.true(), true=v.copy())], default=w.copy())
    assert _first_evaluated(case) is case


def test_let_writes_inline_only_a_deterministic_value_read_first():
    value = exp.Mul(this=exp.column("a"), expression=exp.Literal.number(2))
    # Read first: inline (parenthesised where it is not a call).
    read_first = Writer(try_=False).let([value], lambda v: exp.Case(
        ifs=[exp.If(this=exp.Is(this=v.use(), expression=exp.Null()), true=exp.Literal.number(0))], default=v.use()))
    assert "transform" not in read_first.sql("spark").lower() and "(a * 2)" in read_first.sql("spark")
    # Read only in a branch: a value that raises would raise where the binding's did not skip it.
    in_a_branch = Writer(try_=False).let([value], lambda v: exp.Case(
        ifs=[exp.If(this=exp.column("b"), true=v.use())], default=exp.Literal.number(0)))
    assert "transform" in in_a_branch.sql("spark").lower()
    # Not deterministic: computed once, bound.
    random = exp.Mul(this=exp.Rand(), expression=exp.Literal.number(2))
    assert "transform" in Writer(try_=False).let([random], lambda v: exp.Add(this=v.use(), expression=v.use())
                                                 ).sql("spark").lower()


@pytest.mark.spark
@pytest.mark.xdist_group("spark")
def test_an_inline_let_computes_what_the_bound_one_does_on_spark(spark_engine, monkeypatch):
    """A scaled, rounded value as a SUM writes it, inline and bound by ``transform``, over values
    that round to ±0, are huge, NULL, NaN or infinite: the same results, signs of zero included."""
    from dpsql.backends.spark import rewrites

    def scaled() -> str:
        value = exp.Mul(this=exp.column("a"), expression=exp.Literal.number(524288))
        rounded = Writer(try_=False).let([value], lambda v: exp.Case(
            ifs=[exp.If(this=exp.EQ(this=exp.Round(this=v.use()), expression=exp.Literal.number(0)),
                        true=exp.Mul(this=v.use(), expression=exp.Literal.number(0)))],
            default=exp.Round(this=v.use())))
        return rounded.sql("spark")

    inline = scaled()
    monkeypatch.setattr(rewrites, "_inlined", lambda value, body: None)
    bound = scaled()
    assert "transform" not in inline.lower() and "transform" in bound.lower()
    spark = spark_engine.load({"dp_let_grid": pd.DataFrame(
        {"a": [0.0, -0.0, -1e-7, 1e-7, 2.5, -2.5, 1e300, None, math.nan, math.inf]})})
    got = spark.sql(f"SELECT a, {inline} AS r FROM dp_let_grid").collect()
    want = spark.sql(f"SELECT a, {bound} AS r FROM dp_let_grid").collect()
    assert sorted(repr(tuple(row)) for row in got) == sorted(repr(tuple(row)) for row in want)
    zeros = {repr(row.a): math.copysign(1.0, row.r) for row in got if row.r == 0}
    assert zeros == {"0.0": 1.0, "-0.0": -1.0, "-1e-07": -1.0, "1e-07": 1.0}
