"""The per-unit contribution model end to end (issue 37, item 1): bounds from the policy's BOUNDS PER
UNIT and from the call's contribution_bounds_per_group, the released values of each family's
per-unit form, BigQuery's AVG estimand, refusals, and the stated intervals' coverage.
Sensitivities are checked by brute force in tests/test_sensitivity_oracle.py."""

from __future__ import annotations

import math

import duckdb
import pytest

import dpsql
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource

POLICY = """BUDGET EPSILON 1000000; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 40, MAX GROUPS PER UNIT 2,
  x BOUNDS 0 TO 10, y BOUNDS -5 TO 20, x BOUNDS PER UNIT 0 TO 100, y BOUNDS PER UNIT -50 TO 200,
  g KEYS ('a', 'b'));"""


@pytest.fixture
def db():
    con = duckdb.connect()
    con.execute("""CREATE TABLE t AS SELECT i % 200 AS uid, CASE WHEN i % 3 = 0 THEN 'a' ELSE 'b' END AS g,
                   ((i * 7) % 11) * 0.5::DOUBLE AS x, ((i * 7) % 11) * 0.75::DOUBLE + (i % 5) - 2 AS y
                   FROM range(4000) r(i)""")
    with dpsql.connect(con, policy=POLICY, rng=SeededSource(7)) as connection:
        yield connection, con


EXACT = {
    "SELECT SUM(x) FROM t": "SELECT SUM(x) FROM t",
    "SELECT AVG(x) FROM t": "SELECT AVG(x) FROM t",
    "SELECT VAR_POP(y) FROM t": "SELECT VAR_POP(y) FROM t",
    "SELECT STDDEV_SAMP(y) FROM t": "SELECT STDDEV_SAMP(y) FROM t",
    "SELECT CORR(y, x) FROM t": "SELECT CORR(y, x) FROM t",
    "SELECT COVAR_POP(y, x) FROM t": "SELECT COVAR_POP(y, x) FROM t",
    "SELECT REGR_SLOPE(y, x) FROM t": "SELECT REGR_SLOPE(y, x) FROM t",
}


@pytest.mark.parametrize("sql", list(EXACT))
def test_per_unit_forms_release_the_same_statistic(db, sql):
    """No unit's total reaches its bound here, so the per-unit form (chosen: it lowers the noise)
    estimates exactly what the rows form does: at a large epsilon the release is the exact answer
    up to the noise and the grid (relative 5e-3)."""
    connection, raw = db
    assert "per-unit model" in connection.explain(sql, epsilon=1000)
    released = connection.sql(sql, epsilon=1000).fetchall()[0][0]
    exact = raw.sql(EXACT[sql]).fetchall()[0][0]
    assert math.isclose(released, float(exact), rel_tol=5e-3), (released, exact)


def test_bigquery_avg_is_a_mean_of_unit_means():
    """AVG(x, contribution_bounds_per_group => (lo, hi)) averages each unit's own average (BigQuery):
    unit 1 has one value 0, units 2 and 3 have 30 values 6: the mean of values is ~5.8, the mean
    of the units' means 4, and with bounds (0, 5) the means are clamped first: (0 + 5 + 5) / 3."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1 AS uid, 'a' AS g, 0.0 AS x, 0.0 AS y "
                "UNION ALL SELECT 2 + i % 2, 'a', 6.0, 0.0 FROM range(60) r(i)")
    con.execute("ALTER TABLE t ALTER x TYPE DOUBLE; ALTER TABLE t ALTER y TYPE DOUBLE")
    with dpsql.connect(con, policy=POLICY, rng=SeededSource(1)) as connection:
        wide = connection.sql("SELECT AVG(x, contribution_bounds_per_group => (0, 10)) FROM t", epsilon=10**4)
        assert math.isclose(wide.fetchall()[0][0], 4.0, abs_tol=0.01)
        narrow = connection.sql("SELECT AVG(x, contribution_bounds_per_group => (0, 5)) FROM t", epsilon=10**4)
        assert math.isclose(narrow.fetchall()[0][0], 10 / 3, abs_tol=0.01)
        text = connection.explain("SELECT AVG(x, contribution_bounds_per_group => (0, 5)) FROM t", epsilon=1)
        assert "mean of the units' own means" in text and "another estimand" in text


def test_bigquery_sum_clamps_each_units_total():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i % 4 AS uid, 'a' AS g, 10.0::DOUBLE AS x, 0.0::DOUBLE AS y "
                "FROM range(40) r(i)")
    with dpsql.connect(con, policy=POLICY, rng=SeededSource(1)) as connection:
        result = connection.sql("SELECT SUM(x, contribution_bounds_per_group => (0, 25)) FROM t", epsilon=10**4)
        assert math.isclose(result.fetchall()[0][0], 100.0, abs_tol=0.1)  # four units, each 100 clamped to 25


def test_a_unit_without_values_contributes_nothing():
    """A unit whose values in a group are all NULL has a NULL total there: it adds nothing to the
    sum, and no average (nor 1 to the count of units) — never its bound (LEAST and GREATEST
    would make a NULL the bound)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1 AS uid, 'a' AS g, NULL::DOUBLE AS x, 0.0::DOUBLE AS y FROM range(3) "
                "UNION ALL SELECT 2, 'a', 4.0, 0.0")
    with dpsql.connect(con, policy=POLICY, rng=SeededSource(3)) as connection:
        total = connection.sql("SELECT SUM(x, contribution_bounds_per_group => (-50, 50)) FROM t", epsilon=10**5)
        assert math.isclose(total.fetchall()[0][0], 4.0, abs_tol=0.01)
        mean = connection.sql("SELECT AVG(x, contribution_bounds_per_group => (-8, 8)) FROM t", epsilon=10**5)
        assert math.isclose(mean.fetchall()[0][0], 4.0, abs_tol=0.01)


@pytest.mark.parametrize("sql, message", [
    ("SELECT SUM(x, contribution_bounds_per_group => (5, 1)) FROM t", "lower bound above"),
    ("SELECT AVG(x, contribution_bounds_per_group => (0, y)) FROM t", "must be two numbers"),
    ("SELECT SUM(x, contribution_bounds_per_grup => (0, 1)) FROM t", "unknown named argument"),
])
def test_bad_contribution_bounds_are_refused_before_the_charge(db, sql, message):
    connection, _ = db
    before = connection.budget.spent
    with pytest.raises(UnsupportedQuery, match=message):
        connection.sql(sql, epsilon=1)
    assert connection.budget.spent == before


def test_the_rows_model_is_kept_where_the_per_unit_one_is_noisier(db):
    """GROUP BY with 2 groups per unit: AVG(x)'s per-unit sum (L1 2 × 100) is no less noisy than the
    centred rows-model sum (40 rows × 5 in the column's units): the rows model, no per-unit clamp."""
    connection, _ = db
    text = connection.explain("SELECT g, AVG(x) FROM t GROUP BY g", epsilon=1)
    assert "per-unit model" not in text and "centred sum" in text


def test_a_per_unit_form_that_cannot_be_computed_leaves_the_rows_model():
    """A per-unit bound so large that its noise is beyond the exact samplers at this epsilon: the
    rows model answers SUM (not a refusal); BigQuery's AVG, defined only per unit, is refused
    before anything is charged."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i % 5 AS uid, 'a' AS g, (i % 7)::DOUBLE AS x, 0.0::DOUBLE AS y "
                "FROM range(100) r(i)")
    with dpsql.connect(con, policy=POLICY, rng=SeededSource(2)) as connection:
        sql = "SELECT SUM(x, contribution_bounds_per_group => (0, 1e300)) FROM t"
        assert "rows model" in connection.explain(sql, epsilon=0.001)
        connection.sql(sql, epsilon=0.001)
        before = connection.budget.spent
        with pytest.raises(dpsql.DPError):
            connection.sql("SELECT AVG(x, contribution_bounds_per_group => (0, 1e300)) FROM t", epsilon=0.001)
        assert connection.budget.spent == before


@pytest.mark.slow
def test_stated_intervals_of_the_per_unit_avg_cover_the_truth(db):
    """The per-unit AVG's intervals (the corners of (S' ± h_S) / (C' ± h_C)) hold the bounded truth
    at least as often as stated: over 300 releases at 95%, at least 270 (a correct 95% interval
    misses more than 30 times with probability below 1e-6)."""
    connection, raw = db
    truth = raw.sql("SELECT AVG(x) FROM t").fetchall()[0][0]
    covered = 0
    for i in range(300):
        frame = connection.sql("SELECT AVG(x) AS a FROM t", epsilon=0.05 + i * 1e-9).intervals()
        covered += frame["a_low"][0] <= truth <= frame["a_high"][0]
    assert covered >= 270


def test_a_cached_rows_model_statement_never_answers_a_per_unit_plan():
    """An attacker's review: the statement cache was keyed on a hand-kept list of measure fields
    that missed the per-unit clamp, so a Laplace query (rows model: L1 picks it) left a statement
    without the clamp that a later Gaussian query (per-unit model: L2 picks it) reused, while its
    noise assumed the clamp: one unit of 100 rows moved the sum by 100 where the plan said 1."""
    policy = ("BUDGET EPSILON 1000000 DELTA 0.5; NOISE GAUSSIAN; PRIVATE TABLE t (PRIVACY UNIT uid, "
              "MAX ROWS PER UNIT 100, MAX GROUPS PER UNIT 100, x BOUNDS 0 TO 1, x BOUNDS PER UNIT 0 TO 1, "
              "g KEYS FROM keys.g); PUBLIC TABLE keys;")
    sql = "SELECT g, SUM(x) AS s FROM t GROUP BY g"

    def answer(victim: bool) -> float:
        con = duckdb.connect()
        con.execute("CREATE TABLE keys AS SELECT * FROM (VALUES ('a'), ('b')) k(g)")
        con.execute("CREATE TABLE t (uid INTEGER, g VARCHAR, x INTEGER)")
        con.execute("INSERT INTO t VALUES (1, 'a', 1), (2, 'a', 1), (3, 'b', 1)")
        if victim:
            con.execute("INSERT INTO t SELECT 99, 'a', 1 FROM range(100)")
        db = dpsql.connect(con, policy=policy)
        db.sql(sql, epsilon=0.001, noise="laplace")  # the rows model's statement, cached
        assert "per-unit" in db.explain(sql, epsilon=100000, delta=1e-6)
        return dict(db.sql(sql, epsilon=100000, delta=1e-6).fetchall())["a"]  # sigma ~ 0.02

    assert abs(answer(True) - answer(False)) < 1.5  # the clamp holds: the victim adds at most 1
